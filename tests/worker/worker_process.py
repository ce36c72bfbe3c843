"""Start and stop real Celery worker processes (threads pool, tiny LFM2-VL model) for tests and benches."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from worker.config import Settings

ROOT = Path(__file__).resolve().parents[2]


def worker_env(settings: Settings, model: Path, max_running: int = 4, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "REDIS_URL": settings.redis_url,
        "OWLET_KEY_PREFIX": settings.key_prefix,
        "OWLET_HEARTBEAT_INTERVAL_S": str(settings.heartbeat_interval_s),
        "OWLET_HEARTBEAT_TTL_S": str(settings.heartbeat_ttl_s),
        "OWLET_QUEUE_TIMEOUT_S": str(settings.queue_timeout_s),
        "OWLET_JOB_DEADLINE_S": str(settings.job_deadline_s),
        "OWLET_HISTORY_MAX_TURNS": str(settings.history_max_turns),
        "OWLET_HISTORY_MAX_CHARS": str(settings.history_max_chars),
        "OWLET_MAX_IMAGES_PER_REQUEST": str(settings.max_images_per_request),
        "OWLET_MODEL": str(model),
        "OWLET_MAX_RUNNING": str(max_running),
        "OWLET_DEVICE": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": str(ROOT),
    })
    env.update(extra)
    return env


class WorkerProcess:
    """One ``celery worker`` subprocess; ``name`` is its Celery node name (and heartbeat id)."""

    def __init__(self, env: dict[str, str], log_dir: Path, name: str | None = None, concurrency: int | None = 6,
                 cwd: Path = ROOT):
        """``concurrency``: Celery threads (``-c``); None leaves Owlet's default (the engine's max_active + 2).
        ``cwd``: the source tree it runs from (a benchmark may run an older revision beside this one)."""
        self.name = name or f"w{uuid.uuid4().hex[:6]}@owlet-test"
        self.log_path = log_dir / f"{self.name.split('@')[0]}.log"
        threads = [] if concurrency is None else ["-c", str(concurrency)]
        cmd = [sys.executable, "-m", "celery", "-A", "worker.main", "worker", "-P", "threads", *threads,
               "-n", self.name, "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "info"]
        self._log = open(self.log_path, "wb")
        self._terminated = False
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def wait_ready(self, client, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(w["worker"] == self.name for w in client.health()["workers"]):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(f"worker {self.name} did not start; log:\n{self.log()[-4000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM, once), without waiting: ``stop`` then waits."""
        if self.proc.poll() is None and not self._terminated:
            self.proc.send_signal(signal.SIGTERM)
            self._terminated = True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._log.close()
