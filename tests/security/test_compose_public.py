"""docker-compose.yml as a public deployment: Redis bounded without silent eviction, Flower behind a login."""
from __future__ import annotations

import yaml

from tests.ui.stack import ROOT


def services() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_redis_is_bounded_and_never_evicts_jobs_or_history():
    command = services()["redis"]["command"]
    assert "--maxmemory" in command
    assert command[command.index("--maxmemory-policy") + 1] == "noeviction"


def test_flower_needs_a_login_and_is_not_published_to_the_world():
    flower = services()["flower"]
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    assert "FLOWER_BASIC_AUTH" in " ".join(flower["command"]) and "exit 1" in " ".join(flower["command"])
    assert all(str(p).startswith("127.0.0.1:") for p in flower["ports"])


def test_ui_gets_the_public_settings():
    env = services()["ui"]["environment"]
    for name in ("OWLET_UI_IDENTITY_KEY", "OWLET_UI_TRUSTED_PROXIES", "OWLET_UI_METRICS_TOKEN"):
        assert name in env, name
