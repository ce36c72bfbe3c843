"""What `docker compose config` resolves: Redis persistence on a named volume, entry-point commands, and the
environment names the code reads (the static half; test_compose_stack.py runs the services)."""
from __future__ import annotations

import subprocess

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
