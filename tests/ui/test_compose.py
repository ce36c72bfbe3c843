"""docker-compose.yml is valid and wires what the README promises (no Docker engine needed: `config` only)."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.ui.stack import ROOT


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) when the docker CLI has it, else the standalone docker-compose."""
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


COMPOSE = compose_command()


@pytest.mark.skipif(COMPOSE is None, reason="no docker compose CLI here")
def test_compose_config_is_valid_and_scales_gpu_workers():
    env = {**os.environ, "OWLET_WORKERS": "3", "OWLET_UI_PORT": "8080", "OWLET_MODELS_DIR": "/srv/models"}
    result = subprocess.run([*COMPOSE, "-f", "docker-compose.yml", "--profile", "flower", "config"], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    config = result.stdout
    for service in ("redis:", "worker:", "ui:", "flower:"):
        assert f"\n  {service}" in config, service
    assert "replicas: 3" in config
    assert "driver: nvidia" in config and "- gpu" in config
    assert "published: 8080" in config or "8080:7860" in config
    assert "/srv/models:/app/models:ro" in config or "source: /srv/models" in config
    assert "REDIS_URL: redis://redis:6379/0" in config


def test_dockerfile_builds_the_app_and_an_optional_flower_image():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert "pip install -r requirements.txt" in dockerfile
    assert "AS flower" in dockerfile and "flower==" in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "models" in ignored
