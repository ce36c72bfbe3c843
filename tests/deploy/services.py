"""Run Owlet's services as real processes for deployment tests: started like a user or compose would, with
their output in a log file, stopped with their whole process group."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent  # where owlet-worker / owlet-page are installed


def clean_env(**overrides: str) -> dict[str, str]:
    """This environment without OWLET_* settings or PYTHONPATH (imports must work from the install alone)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("OWLET_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", GRADIO_ANALYTICS_ENABLED="False")
    env.update(overrides)
    return env


class Service:
    """One process (and its group); ``log`` holds its stdout and stderr."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], cwd: Path, log_dir: Path):
        self.name, self.argv = name, argv
        self.log = log_dir / f"{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-3000:]}")

    def stop(self, grace_s: float = 10.0) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def http_get(url: str, timeout_s: float = 5.0, token: str | None = None) -> tuple[int, str]:
    """GET ``url``; with ``token``, as an operator (``Authorization: Bearer``, see ui/ops/endpoints.py)."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def wait_for_workers(page_url: str, count: int, services: list[Service], timeout_s: float = 180.0,
                     token: str | None = None) -> dict:
    """Wait until the page's /healthz reports ``count`` live workers; fail early if a service dies.

    A stranger's /healthz says only ``{"ok": ...}`` (ok: Redis answers and a worker is alive), so counting
    more than one worker needs the operator's metrics ``token``."""
    assert count == 1 or token, "only an operator's /healthz names the workers"
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        for service in services:
            service.check_alive()
        with contextlib.suppress(OSError):
            status, body = http_get(page_url.rstrip("/") + "/healthz", token=token)
            last = body
            health = json.loads(body) if status == 200 else {}
            if health.get("ok") and len(health.get("workers", [None])) >= count:
                return health
        time.sleep(0.5)
    raise AssertionError(f"no {count} live workers after {timeout_s:.0f} s; last /healthz: {last}; logs:\n"
                         + "\n".join(f"--- {s.name}\n{s.output()[-2000:]}" for s in services))


def host_tool(name: str, *candidates: str) -> str:
    """The path of a Debian tool a test drives (``scripts/ensure_test_tools.sh`` installs it). Missing, the test skips
    on a developer's machine and fails under CI (``CI`` set), where it must run."""
    import shutil

    import pytest

    for candidate in (name, *candidates):
        found = shutil.which(candidate) or (candidate if os.path.isabs(candidate) and os.access(candidate, os.X_OK)
                                            else None)
        if found:
            return found
    message = f"{name} is not installed (scripts/ensure_test_tools.sh installs it)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
