"""The page's groups of modules form layers: a group imports only the groups below it (docs/design.md, "The
page's layers"). Parsed from the source, no imports run.

A group is a folder of ``ui/`` (``ui/chat/``) or one of its top-level modules (``ui/server.py``). An import of a
group above (``ui/uploads/`` importing ``ui/edge/``) fails here: move the shared piece down (``ui/shared/``), or
pass it in from above.
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UI = ROOT / "ui"

# Lowest first. Each group may import any group listed before it, never one after it.
LAYERS = ("shared", "__init__", "identity", "config", "uploads", "page_style", "page_script", "gradio_adapters",
          "edge", "chat", "api", "ops", "sign_in", "app", "server", "__main__")


def group_of(module: str) -> str | None:
    """The group of a ``ui`` module, by dotted name; None outside ``ui``."""
    parts = module.split(".")
    if parts[0] != "ui":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append(node.module)
    return found


def source_files(ui: Path) -> list[Path]:
    return sorted(p for p in ui.rglob("*.py") if "__pycache__" not in p.parts)


def module_of(path: Path, ui: Path) -> str:
    return ".".join(("ui", *path.relative_to(ui).with_suffix("").parts))


def upward_imports(ui: Path = UI) -> list[str]:
    """Every import of a group from a group below it (or from a group with no place in ``LAYERS``)."""
    rank = {name: i for i, name in enumerate(LAYERS)}
    found = []
    for path in source_files(ui):
        source = group_of(module_of(path, ui))
        for module in imported_modules(path):
            target = group_of(module)
            if target is None or target == source:
                continue
            if source not in rank or target not in rank or rank[target] > rank[source]:
                found.append(f"{path.relative_to(ui.parent)} imports {module}")
    return found


def test_every_group_has_a_layer():
    groups = {group_of(module_of(p, UI)) for p in source_files(UI)}
    assert groups <= set(LAYERS), f"give these groups a layer in LAYERS: {sorted(groups - set(LAYERS))}"


def test_no_group_imports_a_group_above_it():
    upward = upward_imports()
    assert not upward, "upward imports (move the shared piece down):\n" + "\n".join(upward)


def test_an_upward_import_is_found(tmp_path):
    """The check sees an upward import, as a plain, a from- and a function-level one."""
    ui = tmp_path / "ui"
    (ui / "shared").mkdir(parents=True)
    (ui / "edge").mkdir()
    (ui / "shared" / "words.py").write_text("def f():\n    from ui.edge.limits import LIMIT\n")
    (ui / "edge" / "limits.py").write_text("import ui.chat.view\nfrom ui.shared.words import f\nLIMIT = 1\n")
    assert upward_imports(ui) == ["ui/edge/limits.py imports ui.chat.view",
                                  "ui/shared/words.py imports ui.edge.limits"]
