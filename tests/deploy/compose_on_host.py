"""Turn docker-compose.yml services into host processes, the way Docker would run them from this checkout.

What Docker would do, done here without Docker:

- ``${VAR:-default}`` interpolation from an environment (compose's own rules for ``:-`` and ``-``, and ``$$`` for a
  literal ``$``);
- the service's ``environment`` on top of the Dockerfile's ``ENV``; ``WORKDIR`` (/app) is the checkout;
- a volume ``HOST:/app/models`` makes ``/app/models/...`` paths point at HOST (the checkout's models/);
- each container has its own hostname (Celery's ``%h``) and network namespace, so a port inside it (7860,
  the metrics port) is mapped to a free host port here, as compose's ``ports:`` would map it.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def interpolate(value, env: dict[str, str]):
    if isinstance(value, str):
        def one(match):
            if match.group(0) == "$$":  # compose's escape: a literal $ for the container's shell
                return "$"
            name, op, default = match.groups()
            if op == ":-":
                return env.get(name) or default
            if op == "-":
                return env.get(name, default)
            return env.get(name, "")

        return INTERPOLATION.sub(one, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def load_compose(path: Path, env: dict[str, str]) -> dict:
    return interpolate(yaml.safe_load(path.read_text()), env)


def dockerfile_env_and_workdir(path: Path, stage: str = "base") -> tuple[dict[str, str], str]:
    """ENV and WORKDIR of one build stage (line continuations joined)."""
    text = re.sub(r"\\\n", " ", path.read_text())
    env, workdir, current = {}, "/", None
    for line in text.splitlines():
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if words[0] == "FROM":
            current = words[-1] if "AS" in words else None
        elif current == stage and words[0] == "ENV":
            for pair in words[1:]:
                key, _, value = pair.partition("=")
                env[key] = value
        elif current == stage and words[0] == "WORKDIR":
            workdir = words[1]
    return env, workdir


def mounted(path: str, volumes: list[str], project_dir: Path) -> str:
    """A path inside the container as the matching bind mount makes it on the host."""
    for volume in volumes:
        host, container = volume.split(":")[:2]
        if path == container or path.startswith(container.rstrip("/") + "/"):
            return str((project_dir / host).resolve()) + path[len(container):]
    return path
