"""Every OWLET_* name a user can meet is read by the code, and every name the code reads is documented.

"Read by the code" = the variables the three settings objects read (``owlet.settings.env_names``) plus names
the code spells out literally (``OWLET_CACHE_DIR`` in training, the tests' own knobs). "Used" = names in the
README, every docs/*.md, docker-compose.yml, the Dockerfile and scripts/. "Documented" = named in
docs/configuration.md, the full settings table. Compose's own interpolation variables (``${OWLET_WORKERS:-1}`` …)
configure compose, not Owlet, so they only need to be documented.

To add a setting: add a field to ``EngineConfig``, ``worker.config.Settings`` or ``ui.config.UIConfig`` and a
row to a table in docs/configuration.md.
"""
from __future__ import annotations

import re
from pathlib import Path

from engine.config import ENV_PREFIX as ENGINE_PREFIX, EngineConfig
from owlet.settings import env_names
from ui import config as ui_config
from worker import config as worker_config

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bOWLET_[A-Z0-9_]*[A-Z0-9]\b")
CODE_DIRS = ("engine", "worker", "ui", "owlet", "training", "bench")
LITERAL_READ = re.compile(r"""environ(?:\.get)?\s*[\(\[]\s*["'](OWLET_[A-Z0-9_]+)["']""")


def names_read_by_settings() -> set[str]:
    return {*env_names(EngineConfig, ENGINE_PREFIX),
            *env_names(worker_config.Settings, worker_config.ENV_PREFIX, skip=worker_config.ENV_SKIP),
            *env_names(ui_config.UIConfig, ui_config.ENV_PREFIX, skip=ui_config.ENV_SKIP),
            "OWLET_KEY_PREFIX"}


def names_read_by_code() -> set[str]:
    names = names_read_by_settings()
    files = [p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")]
    files += list((ROOT / "scripts").glob("*.py")) + list((ROOT / "tests").rglob("*.py"))
    for path in files:
        names |= set(LITERAL_READ.findall(path.read_text()))
    return names


def compose_interpolation_names() -> set[str]:
    text = (ROOT / "docker-compose.yml").read_text()
    return set(re.findall(r"\$\{(OWLET_[A-Z0-9_]+)", text))


def compose_environment_keys() -> set[str]:
    text = (ROOT / "docker-compose.yml").read_text()
    return set(re.findall(r"^\s+(OWLET_[A-Z0-9_]+):", text, re.M))


CONFIGURATION = ROOT / "docs" / "configuration.md"


def used_names() -> dict[str, set[str]]:
    places = {"README.md": (ROOT / "README.md").read_text(), "Dockerfile": (ROOT / "Dockerfile").read_text()}
    for path in sorted((ROOT / "docs").glob("*.md")):
        places[f"docs/{path.name}"] = path.read_text()
    for path in sorted((ROOT / "scripts").iterdir()):
        if path.is_file():
            places[f"scripts/{path.name}"] = path.read_text()
    found = {place: set(NAME.findall(text)) for place, text in places.items()}
    found["docker-compose.yml environment"] = compose_environment_keys()
    return found


def test_every_name_used_in_docs_compose_dockerfile_and_scripts_is_read_by_the_code():
    read = names_read_by_code()
    compose_only = compose_interpolation_names() - compose_environment_keys()
    unknown = {place: sorted(names - read - compose_only)
               for place, names in used_names().items()}
    unknown = {place: names for place, names in unknown.items() if names}
    assert not unknown, f"names no code reads (typo, or a setting that was renamed or removed): {unknown}"


def test_every_name_the_code_reads_and_every_compose_variable_is_documented_in_the_configuration_page():
    documented = set(NAME.findall(CONFIGURATION.read_text()))
    missing = sorted((names_read_by_code() | compose_interpolation_names()) - documented)
    assert not missing, f"add these to a settings table in docs/configuration.md: {missing}"


def test_the_readme_and_docs_are_among_the_places_checked():
    """The checks above read the documents (a name list that silently missed them would check nothing)."""
    places = used_names()
    assert "README.md" in places and "docs/configuration.md" in places, sorted(places)
    assert {"OWLET_MODEL", "OWLET_UI_SECRET"} <= places["README.md"], "the README names the settings people change"
    assert "OWLET_STUB_TOKENS_PER_S" in places["docs/configuration.md"]


def test_compose_gives_the_worker_the_metrics_port_name_the_worker_reads():
    assert "OWLET_WORKER_METRICS_PORT" in compose_environment_keys()
    assert "OWLET_METRICS_PORT" not in names_read_by_code()


def test_the_start_up_check_knows_every_name_the_code_and_compose_read():
    """owlet.setting_names warns about OWLET_* variables nothing reads: its lists must match the code and compose,
    or it would warn about a real setting, or stay silent about one compose sets."""
    from owlet import setting_names

    literal = names_read_by_code() - names_read_by_settings()
    assert literal <= setting_names.READ_DIRECTLY, \
        "add these direct os.environ reads to owlet.setting_names.READ_DIRECTLY"
    assert setting_names.READ_DIRECTLY <= names_read_by_code()
    assert setting_names.names_read() == names_read_by_settings() | setting_names.READ_DIRECTLY
    assert setting_names.COMPOSE_ONLY == compose_interpolation_names() - names_read_by_code()
    assert not set(setting_names.REPLACED) & names_read_by_code(), "a replaced name is read again: drop it"
    assert set(setting_names.REPLACED.values()) <= names_read_by_code()
