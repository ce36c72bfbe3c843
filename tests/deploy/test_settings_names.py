"""Every OWLET_* name a user can meet is read by the code, and every name the code reads is documented.

"Read by the code" = the variables the three settings objects read (``owlet.settings.env_names``) plus names
the code spells out literally (``OWLET_CACHE_DIR`` in training, the tests' own knobs). "Used" = names in the
README, docker-compose.yml, the Dockerfile and scripts/. Compose's own interpolation variables
(``${OWLET_WORKERS:-1}`` …) configure compose, not Owlet, so they only need to be documented.

To add a setting: add a field to ``EngineConfig``, ``worker.config.Settings`` or ``ui.config.UIConfig`` and a
row to a settings table in the README.
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


def used_names() -> dict[str, set[str]]:
    places = {"README.md": (ROOT / "README.md").read_text(), "Dockerfile": (ROOT / "Dockerfile").read_text()}
    for path in sorted((ROOT / "scripts").iterdir()):
        if path.is_file():
            places[f"scripts/{path.name}"] = path.read_text()
    found = {place: set(NAME.findall(text)) for place, text in places.items()}
    found["docker-compose.yml environment"] = compose_environment_keys()
    return found


def test_every_name_used_in_docs_compose_dockerfile_and_scripts_is_read_by_the_code():
    read = names_read_by_code()
    compose_only = compose_interpolation_names() - compose_environment_keys()
    unknown = {place: sorted(names - read - compose_only) for place, names in used_names().items()}
    unknown = {place: names for place, names in unknown.items() if names}
    assert not unknown, f"names no code reads (typo, or a setting that was renamed or removed): {unknown}"


def test_every_name_the_code_reads_and_every_compose_variable_is_documented_in_the_readme():
    readme = set(NAME.findall((ROOT / "README.md").read_text()))
    missing = sorted((names_read_by_code() | compose_interpolation_names()) - readme)
    assert not missing, f"add these to a settings table in README.md: {missing}"


def test_compose_gives_the_worker_the_metrics_port_name_the_worker_reads():
    assert "OWLET_WORKER_METRICS_PORT" in compose_environment_keys()
    assert "OWLET_METRICS_PORT" not in names_read_by_code()
