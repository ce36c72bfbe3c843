"""What `docker compose config` resolves: Redis persistence on a named volume, entry-point commands, the
environment names the code reads, every documented setting set in .env reaching the container that reads it, and
OWLET_DEVICE=cpu reserving no GPU (the static half; test_compose_stack.py runs the services)."""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.ui.test_compose import COMPOSE, ROOT


@pytest.mark.skipif(COMPOSE is None, reason="no docker compose CLI here")
def test_compose_resolves_persistent_redis_and_entry_point_commands():
    result = subprocess.run([*COMPOSE, "-f", "docker-compose.yml", "config"], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    services = config["services"]
    redis = services["redis"]
    command = " ".join(redis["command"])
    assert "--appendonly yes" in command and "--appendfsync everysec" in command, command
    mounts = [v if isinstance(v, str) else f"{v.get('source')}:{v.get('target')}" for v in redis["volumes"]]
    assert any(m.startswith("redis-data:/data") for m in mounts), mounts  # compose v1 short / v2 long form
    assert "redis-data" in config["volumes"]
    assert services["worker"]["command"][0] == "owlet-worker"
    assert services["ui"]["command"][0] == "owlet-page"
    worker_env = services["worker"]["environment"]
    assert worker_env["OWLET_WORKER_METRICS_PORT"] == "9100" and "OWLET_METRICS_PORT" not in worker_env


# docs/configuration.md's sections of settings, and the services each is read in.
SECTIONS = {"## Engine": ("worker",), "## Worker and queue": ("worker", "ui"),
            "### Per client group": ("worker", "ui"), "## Page": ("ui",), "### Running in public": ("ui",)}
# Set by the page's command inside its container (it must listen on every interface, on the port compose
# publishes): OWLET_UI_PORT is the port published on the host instead.
FIXED_BY_COMMAND = {"OWLET_UI_HOST", "OWLET_UI_PORT"}


def documented_settings() -> dict[str, tuple[str, ...]]:
    """Every variable named in the first column of docs/configuration.md's settings tables, and its services."""
    text = (ROOT / "docs" / "configuration.md").read_text()
    found: dict[str, tuple[str, ...]] = {}
    services: tuple[str, ...] = ()
    for line in text.splitlines():
        if line.startswith("#"):
            services = next((s for heading, s in SECTIONS.items() if line.startswith(heading)), ())
        elif services and line.startswith("| `"):
            for name in re.findall(r"`((?:OWLET_|REDIS_URL)[A-Z0-9_]*)", line.split("|")[1]):
                found[name] = services
    return found


def compose_config(env_file: Path, *profiles: str) -> dict:
    """What `docker compose config` resolves with ``env_file`` as the .env and nothing else in the environment."""
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    flags = [a for p in profiles for a in ("--profile", p)]
    result = subprocess.run([*COMPOSE, "--env-file", str(env_file), "-f", "docker-compose.yml", *flags, "config"],
                            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


@pytest.mark.skipif(COMPOSE is None, reason="no docker compose CLI here")
def test_every_setting_in_dotenv_reaches_its_container_and_cpu_drops_the_gpu(tmp_path):
    settings = documented_settings()
    assert {"OWLET_MODEL", "OWLET_GROUP_SUBMIT_LIMIT", "OWLET_UI_TRUSTED_PROXIES", "OWLET_PARK_MODE",
            "OWLET_MAX_PREFILL_TOKENS", "OWLET_UI_MAX_NEW_TOKENS", "REDIS_URL"} <= set(settings), "the tables were read"
    values = {name: f"set-{name.lower().replace('_', '-')}" for name in settings}
    values.update(OWLET_DEVICE="cpu", OWLET_UI_PORT="8123")
    dotenv = tmp_path / ".env"
    dotenv.write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    services = compose_config(dotenv)["services"]
    missing = {}
    for name, where in settings.items():
        if name in FIXED_BY_COMMAND:
            continue
        for service in where:
            if services[service].get("environment", {}).get(name) != values[name]:
                missing.setdefault(service, []).append(name)
    assert not missing, f"settings set in .env that do not reach their container: {missing}"
    assert any(str(p.get("published") if isinstance(p, dict) else p).startswith(("8123", "0.0.0.0:8123"))
               for p in services["ui"]["ports"]), services["ui"]["ports"]
    assert "resources" not in services["worker"].get("deploy", {}), "OWLET_DEVICE=cpu reserves no GPU"
    nothing_set = tmp_path / "empty.env"
    nothing_set.write_text("")
    gpu = compose_config(nothing_set)
    assert gpu["services"]["worker"]["deploy"]["resources"]["reservations"]["devices"][0]["driver"] == "nvidia", \
        "without a device named, each worker reserves its GPU"
