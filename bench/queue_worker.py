"""The queue benchmarks' shared setup (``bench/fairness.py``, ``bench/abuse.py``): a real Celery worker with the
tiny LFM2-VL model on a Redis namespace of its own, with queue caps raised so that every job of the flood really
waits in the queue, warmed up with full batches; and each job's wait, first token and service time, read from its
stream.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.redis_server import unique_prefix  # noqa: E402
from tests.worker.worker_process import WorkerProcess, worker_env  # noqa: E402
from training.tiny_checkpoint import ensure_tiny_checkpoint  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402


@contextlib.contextmanager
def queue_worker(redis_url: str, label: str, flood: int, slots: int, log_dir: Path, threads: int | None = None,
                 engine_env: dict[str, str] | None = None, **settings) -> Iterator[OwletClient]:
    """A client on a fresh namespace whose caps admit a ``flood`` of jobs, with one worker of ``slots`` decode rows
    behind it; ``settings`` override the rest (e.g. ``fifo=True``), ``engine_env`` adds worker variables (e.g.
    ``OWLET_TIME_SLICE_TOKENS``). ``threads``: the worker's Celery threads; None runs the shipped default (the
    engine's max_active + 2), as a deployment does."""
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix(label), user_queue_cap=flood + 10,
                                 global_queue_cap=flood + 50, group_job_cap=flood + 10,
                                 group_submit_limit=10 * flood, **settings)
    client = OwletClient(settings=settings)
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"), max_running=slots, **(engine_env or {}))
    worker = WorkerProcess(env, log_dir, concurrency=threads)
    try:
        worker.wait_ready(client)
        yield client
    finally:
        worker.stop()
        client.close(purge=True)


def warm_up(client: OwletClient, slots: int, sampling: dict) -> None:
    """Two full batches, so the first measured batch pays no one-off costs (kernels, caches)."""
    for _ in range(2):
        warm = [client.submit(f"warm{i}", None, f"Warm up {i}.", sampling=sampling).job for i in range(slots)]
        for job in warm:
            list(client.events(job))


def job_times(client: OwletClient, job: str, submitted_at: float) -> dict:
    """A finished job's queue wait (submit -> started), time to its first token, service time (started -> done)
    and queue position when submitted, from its events."""
    events: dict[str, dict] = {}
    for _, event in client.events(job):
        events.setdefault(event["type"], event)  # the first of each type: the first token, the first position
    assert "done" in events, f"job {job} did not finish: " + str({k: v for k, v in events.items() if k != "token"})
    started, done = events["started"]["t"], events["done"]["t"]
    first_token = events["token"]["t"] if "token" in events else done
    return {"started": started, "wait_s": started - submitted_at, "first_token_s": first_token - submitted_at,
            "service_s": done - started, "completion_s": done - submitted_at,
            "position": events.get("queued", {}).get("position")}
