"""The documents name only things that exist: every path, module, symbol and link in README.md and docs/*.md.

What is checked, in README.md and every docs/*.md (paths are relative to the repository root):

- **Paths.** A word is a path when its first ``/``-separated part is an entry at the repository root
  (``engine/batch/dynamic_batch.py``, ``tests/engine``, ``docker-compose.yml``) or when it contains a ``/`` and ends in a
  source extension (``.py``, ``.c``, ``.lua``, ``.sh``); it must exist. A bare file name with a known extension
  (``llm_engine.py``, ``config.json``) must be the name of some file in the repository. A word is a whole inline
  code span without spaces, or one whitespace-separated word of a span or fenced line that has spaces (a command);
  a leading ``./`` and a ``NAME=`` assignment are stripped. Absolute paths (``/models/…``), home paths, hidden
  folders (``.venv/…``, ``.cache/…``), URLs and words with placeholders or globs (``<id>``, ``*``, ``{a,b}``) are
  not paths.
- **Symbols.** An inline code span that is a dotted name (``engine.llm_engine.LLMEngine.step``,
  ``EngineConfig.from_env``, optionally ending in ``()``) or ``package.module:Name`` is a symbol when its first
  part is a project package (a root folder holding Python files: ``engine``, ``bench`` …) or a class defined at the
  top level of a project module (not of the tests); it must resolve, by parsing the source (no imports, so no model
  or Redis is needed). Other dotted names (``torch.…``, ``client.jobs``) are not symbols. ``OWLET_*`` names are
  settings, checked by tests/deploy/test_settings_names.py, not here.
- **Modules run.** Every ``-m <module>`` of a project package, in code spans and fenced blocks, names a module
  ``python -m`` can run.
- **Links.** Every relative Markdown link target exists, and its ``#anchor`` (if any) is a heading of the target.
"""
from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCE_EXTENSIONS = (".py", ".c", ".lua", ".sh")
FILE_EXTENSIONS = SOURCE_EXTENSIONS + (".md", ".yml", ".yaml", ".toml", ".txt", ".ini", ".json", ".png", ".jinja")
NOT_A_PATH = re.compile(r"[*?{}<>$|\\]|://|^[/~.]|^-")
DOTTED = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+(?:\(\))?$")
COLON_FORM = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+:[A-Za-z_]\w*$")  # package.module:Name
RUN_MODULE = re.compile(r"(?:^|\s)-m\s+([A-Za-z_][\w.]*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*```")


# ---- reading the documents ---------------------------------------------------------------------------------

def split_markdown(text: str) -> tuple[list[str], list[str]]:
    """(inline code spans outside fenced blocks, lines inside fenced blocks)."""
    spans, fenced, prose, inside = [], [], [], False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
            continue
        (fenced if inside else prose).append(line)
    for paragraph in "\n".join(prose).split("\n\n"):  # a code span may wrap onto the next line
        spans += [s.strip() for s in re.findall(r"`([^`]+)`", paragraph.replace("\n", " "))]
    return spans, fenced


def words_of(span: str) -> list[str]:
    """The candidate path words of one code span or fenced line."""
    words = [span] if not re.search(r"\s", span) else span.split()
    out = []
    for word in words:
        word = word.strip("()[],;:'\"")
        word = re.sub(r"^[A-Z_][A-Z0-9_]*=", "", word)  # OWLET_MODEL=models/x: the value is the path
        if word.startswith("./"):
            word = word[2:]
        if word:
            out.append(word)
    return out


# ---- the repository ----------------------------------------------------------------------------------------

@cache
def root_entries() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith("."))


@cache
def file_names() -> frozenset[str]:
    skip = {".git", ".venv", ".cache", "__pycache__", "node_modules"}
    names = set()
    for path in ROOT.rglob("*"):
        if not skip.intersection(path.relative_to(ROOT).parts) and path.is_file():
            names.add(path.name)
    return frozenset(names)


@cache
def packages() -> frozenset[str]:
    """Root folders Python can import from the repository root (packages, and namespace packages like bench/)."""
    return frozenset(p.parent.name for p in ROOT.glob("*/*.py") if not p.parent.name.startswith("."))


def module_file(dotted: str) -> Path | None:
    """The source of module ``a.b.c`` (a file or a package's __init__), or None."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


@cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _targets(node) -> list[str]:
    """Names bound at this level by an assignment, definition or import."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    return []


def _body_names(body) -> set[str]:
    names = set()
    for node in body:
        names.update(_targets(node))
        if isinstance(node, (ast.If, ast.Try)):  # names bound under `if TYPE_CHECKING:` or `try:` at this level
            for block in (node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])):
                names |= _body_names(block)
    return names


@cache
def module_names(path: Path) -> frozenset[str]:
    """Top-level names of a module, plus the public names a lazy package exports through ``__all__``."""
    tree = parsed(path)
    names = _body_names(tree.body)
    dicts = {t: n.value for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Dict)
             for t in _targets(n)}
    for node in tree.body:
        if isinstance(node, ast.Assign) and "__all__" in _targets(node):
            value = node.value
            if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Name):
                value = dicts.get(value.args[0].id)  # __all__ = list(_EXPORTS)
            for element in getattr(value, "elts", None) or getattr(value, "keys", None) or []:
                if isinstance(element, ast.Constant) and isinstance(element.value, str):
                    names.add(element.value)
    if path.name == "__init__.py":  # submodules and subpackages are attributes of their package
        names |= {p.stem for p in path.parent.glob("*.py")} | {p.parent.name for p in path.parent.glob("*/__init__.py")}
    return frozenset(names)


@cache
def project_classes() -> dict[str, list[tuple[Path, ast.ClassDef]]]:
    """Every top-level class of the project's code (not of its tests), by name."""
    found: dict[str, list] = {}
    for package in packages() - {"tests"}:
        for path in (ROOT / package).rglob("*.py"):
            for node in parsed(path).body:
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append((path, node))
    return found


def class_names(node: ast.ClassDef) -> set[str]:
    """Methods, class attributes, annotated fields and ``self.x = …`` attributes of a class, and of its project
    base classes."""
    names = _body_names(node.body)
    for item in ast.walk(node):
        if isinstance(item, ast.Attribute) and isinstance(item.ctx, ast.Store) \
                and isinstance(item.value, ast.Name) and item.value.id == "self":
            names.add(item.attr)
    for base in node.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        for _path, base_node in project_classes().get(base_name, []):
            if isinstance(base_node, ast.ClassDef) and base_node is not node:
                names |= class_names(base_node)
    return names


def _member(scope, name: str):
    """The class definition for ``name`` inside a class or module scope (None when it is not a class)."""
    for node in scope.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def resolve_in_class(node, attrs: list[str]) -> bool:
    for i, attr in enumerate(attrs):
        if not isinstance(node, ast.ClassDef) or attr not in class_names(node):
            return False
        if i + 1 < len(attrs):
            node = _member(node, attr)
    return True


# ---- the checks ----------------------------------------------------------------------------------------------

def path_problem(word: str) -> str | None:
    """Why ``word`` names a path that does not exist; None when it exists or is not a path."""
    if NOT_A_PATH.search(word):
        return None
    first = word.split("/")[0]
    if first in root_entries():
        return None if (ROOT / word).exists() else f"no such path: {word}"
    if "/" in word and word.endswith(SOURCE_EXTENSIONS):
        return f"no such path (paths are relative to the repository root): {word}"
    if "/" not in word and word.endswith(FILE_EXTENSIONS):
        return None if word in file_names() else f"no file of this name in the repository: {word}"
    return None


def symbol_problem(span: str) -> str | None:
    """Why ``span`` names a project symbol that does not resolve; None when it resolves or is not a symbol."""
    if COLON_FORM.match(span):
        module, _, attr = span.partition(":")
        if module.split(".")[0] not in packages():
            return None
        path = module_file(module)
        if path is None:
            return f"no such module: {module} (in {span})"
        return None if attr in module_names(path) else f"{module} defines no {attr} (in {span})"
    if not DOTTED.match(span) or span.endswith(FILE_EXTENSIONS):
        return None
    parts = span.removesuffix("()").split(".")
    if parts[0] in packages():
        for cut in range(len(parts), 0, -1):
            path = module_file(".".join(parts[:cut]))
            if path is not None:
                break
        else:
            return f"no such module: {parts[0]}"
        rest = parts[cut:]
        if not rest:
            return None
        if rest[0] not in module_names(path):
            return f"{'.'.join(parts[:cut])} defines no {rest[0]} (in {span})"
        if len(rest) == 1:
            return None
        node = _member(parsed(path), rest[0])
        return None if resolve_in_class(node, rest[1:]) else f"cannot resolve {span}"
    defined = project_classes().get(parts[0])
    if not defined:
        return None  # not a project class: torch.x, client.jobs, ...
    if any(resolve_in_class(node, parts[1:]) for _path, node in defined):
        return None
    return f"{parts[0]} has no {'.'.join(parts[1:])} (in {span})"


def module_problem(module: str) -> str | None:
    """Why ``python -m module`` would not run a project module; None when it would (or it is not the project's)."""
    if module.split(".")[0] not in packages():
        return None
    path = module_file(module)
    if path is None:
        return f"no such module to run: {module}"
    if path.name == "__init__.py" and not (path.parent / "__main__.py").is_file():
        return f"package {module} has no __main__.py to run"
    return None


def heading_slugs(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text."""
    slugs, inside = set(), False
    for line in text.splitlines():
        if FENCE.match(line):
            inside = not inside
        elif not inside and line.startswith("#"):
            title = line.lstrip("#").strip().replace("`", "").lower()
            slugs.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", title)))
    return slugs


def link_problem(doc: Path, text: str, target: str) -> str | None:
    """Why a link in ``doc`` (whose text is ``text``) points nowhere; None when its file and heading exist."""
    if re.match(r"^[a-z]+:", target):  # https:, mailto:
        return None
    file_part, _, anchor = target.partition("#")
    if file_part:
        linked = (doc.parent / file_part).resolve()
        if not linked.exists():
            return f"link to a missing file: {target}"
        text = linked.read_text() if linked.suffix == ".md" else None
    if anchor and text is not None and anchor not in heading_slugs(text):
        return f"link to a missing heading: {target}"
    return None


def problems_in(doc: Path, text: str) -> tuple[list[str], int]:
    """(every problem in one document, how many paths, symbols, modules and links were checked)."""
    spans, fenced = split_markdown(text)
    problems, checked = [], 0
    for span in spans:
        for word in words_of(span):
            checked += 1
            problems.append(path_problem(word))
        checked += 1
        problems.append(symbol_problem(span))
    for line in spans + fenced:
        for module in RUN_MODULE.findall(line):
            checked += 1
            problems.append(module_problem(module))
    for line in fenced:
        for word in words_of(line):
            if "/" in word:
                checked += 1
                problems.append(path_problem(word))
    for target in LINK.findall(text):
        checked += 1
        problems.append(link_problem(doc, text, target))
    return [f"{doc.relative_to(ROOT)}: {p}" for p in problems if p], checked


# ---- the tests -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_symbol_module_and_link_a_document_names_exists(doc):
    problems, checked = problems_in(doc, doc.read_text())
    assert checked > 0, f"{doc} names nothing this test checks: is it being read?"
    assert not problems, "\n".join(problems)


def test_the_documents_name_many_real_paths_and_symbols():
    """The checks above see the documents' names, not an empty list (a parser that found nothing would pass)."""
    spans = [s for doc in DOCS for s in split_markdown(doc.read_text())[0]]
    paths = [w for s in spans for w in words_of(s) if w.split("/")[0] in root_entries() and "/" in w]
    symbols = [s for s in spans if DOTTED.match(s) and (s.split(".")[0] in packages()
                                                        or s.split(".")[0] in project_classes())]
    assert len(paths) >= 100 and len(symbols) >= 20, (len(paths), len(symbols))


@pytest.mark.parametrize("made_up", [
    "`engine/no_such_module.py`", "`tests/engine/test_nothing_here.py`", "`engin/batch.py`", "`no_such_file.py`",
    "`docker-compose.yaml`", "`engine.llm_engine.NoSuchClass`", "`engine.no_such_module`",
    "`LLMEngine.no_such_method`", "`worker.client.OwletClient.no_such_method()`",
    "`engine.models.mplug_owl3.runner:NoSuchRunner`", "`.venv/bin/python -m bench.no_such_bench`",
    "`python -m\nbench.no_such_bench` (a span that wraps)", "```\nbash scripts/no_such_script.sh\n```",
    "[a link](docs/no_such_page.md)", "[a link](#no-such-heading)",
])
def test_a_made_up_name_is_reported(made_up):
    doc = ROOT / "README.md"
    problems, _ = problems_in(doc, f"# Title\n\n{made_up}\n")
    assert problems, f"{made_up} was not reported"


@pytest.mark.parametrize("real", [
    "`engine/batch/dynamic_batch.py`", "`tests/engine`", "`ui/examples/`", "`llm_engine.py`", "`engine.LLMEngine`",
    "`engine.llm_engine.LLMEngine.step`", "`EngineConfig.from_env`", "`worker.config.Settings`",
    "`OwletClient.events`", "`engine.models.mplug_owl3.runner:OwlRunner`", "`python -m bench.engine --dtype float32`",
    "`python -m ui --help`", "`OWLET_MODEL=models/owlet-shapes-vl ./scripts/demo.sh`", "`torch.cuda.synchronize`",
    "`/models/LFM2-VL-1.6B`", "`.cache/demo-redis/`", "[the title](#title)",
])
def test_a_real_or_foreign_name_passes(real):
    problems, _ = problems_in(ROOT / "README.md", f"# Title\n\n{real}\n")
    assert not problems, problems


def test_the_walkthrough_says_which_file_to_open_for_every_module():
    """docs/walkthrough.md's table names every source file of the three layers and owlet/ (a new module gets a row)."""
    text = (ROOT / "docs" / "walkthrough.md").read_text()
    named = {w for s in split_markdown(text)[0] for w in words_of(s)}
    sources = [p for layer in ("engine", "worker", "ui", "owlet") for p in (ROOT / layer).rglob("*")
               if p.suffix in SOURCE_EXTENSIONS and "__pycache__" not in p.parts]
    missing = sorted(str(p.relative_to(ROOT)) for p in sources if str(p.relative_to(ROOT)) not in named)
    assert sources and not missing, f"add these to the table in docs/walkthrough.md: {missing}"


def table_files(text: str) -> list[str]:
    """The files named in the first column of the tables under "## Which file to open" (up to the next ``## ``)."""
    section = re.split(r"^## Which file to open.*$", text, maxsplit=1, flags=re.M)[1].split("\n## ", 1)[0]
    return [m.group(1) for m in re.finditer(r"^\|\s*`([^`]+)`\s*\|", section, flags=re.M)]


def test_every_file_the_walkthrough_table_names_exists():
    """A row of docs/walkthrough.md's "which file to open" table names a file that exists (a moved or removed module
    takes its row along), and no file has two rows."""
    named = table_files((ROOT / "docs" / "walkthrough.md").read_text())
    assert len(named) >= 100, f"the table was not found, or lost rows: {len(named)}"
    missing = [path for path in named if not (ROOT / path).is_file()]
    assert not missing, f"the walkthrough's table names files that do not exist: {missing}"
    twice = sorted({path for path in named if named.count(path) > 1})
    assert not twice, f"named twice in the walkthrough's table: {twice}"


def test_a_table_row_for_a_missing_file_is_found():
    text = "## Which file to open\n\n| module | open it to change… |\n|---|---|\n| `ui/chat/gone.py` | nothing |\n"
    assert table_files(text) == ["ui/chat/gone.py"] and not (ROOT / "ui/chat/gone.py").exists()
