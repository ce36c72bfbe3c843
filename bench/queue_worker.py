"""The queue benchmarks' shared setup (``bench/fairness.py``, ``bench/abuse.py``): a real Celery worker with the
tiny LFM2-VL model on a Redis namespace of its own, with queue caps raised so that every job of the flood really
waits in the queue, warmed up with full batches; and each job's wait, first token and service time, read from its
stream.

A benchmark of several scenes, each on a worker of its own (``bench/abuse.py``), names them up front
(``WorkerSpec``) and takes each from ``Workers``: one after the other (each starts as its scene begins and stops as
it ends, so nothing else runs beside a measured scene), or all started at once and stopped at once (``together``: a
quick run, whose seven worker starts, 4 s each of imports and model load, and stops, 2 s each, took three quarters
of its minute one after the other).
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.redis_server import unique_prefix  # noqa: E402
from tests.worker.worker_process import WorkerProcess, worker_env  # noqa: E402
from training.tiny_checkpoint import ensure_tiny_checkpoint  # noqa: E402
from worker.client import OwletClient  # noqa: E402
from worker.config import Settings  # noqa: E402


@dataclass(frozen=True)
class WorkerSpec:
    """One worker and the client on its fresh namespace: caps that admit a ``flood`` of jobs, ``slots`` decode rows;
    ``settings`` override the rest (e.g. ``fifo=True``), ``engine_env`` adds worker variables (e.g.
    ``OWLET_TIME_SLICE_TOKENS``). ``threads``: the worker's Celery threads; None runs the shipped default (the
    engine's max_active + 2), as a deployment does."""
    label: str
    flood: int
    slots: int
    threads: int | None = None
    engine_env: dict[str, str] = field(default_factory=dict)
    settings: dict = field(default_factory=dict)


class StartedWorker:
    """A ``WorkerSpec``'s client and worker process, started (not yet ready)."""

    def __init__(self, redis_url: str, spec: WorkerSpec, log_dir: Path):
        flood = spec.flood
        settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix(spec.label),
                                     user_queue_cap=flood + 10, global_queue_cap=flood + 50,
                                     group_job_cap=flood + 10, group_submit_limit=10 * flood, **spec.settings)
        self.client = OwletClient(settings=settings)
        env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"), max_running=spec.slots, **spec.engine_env)
        self.process = WorkerProcess(env, log_dir, concurrency=spec.threads)

    def ready(self) -> OwletClient:
        self.process.wait_ready(self.client)
        return self.client

    def stop(self) -> None:
        self.process.stop()
        self.client.close(purge=True)


@contextlib.contextmanager
def queue_worker(redis_url: str, label: str, flood: int, slots: int, log_dir: Path, threads: int | None = None,
                 engine_env: dict[str, str] | None = None, **settings) -> Iterator[OwletClient]:
    """A client on a fresh namespace with one worker behind it, ready (``WorkerSpec`` says what each argument
    sets); stopped, and its namespace purged, on exit."""
    started = StartedWorker(redis_url, WorkerSpec(label, flood, slots, threads, dict(engine_env or {}), settings),
                            log_dir)
    try:
        yield started.ready()
    finally:
        started.stop()


class Workers:
    """The workers of a benchmark's scenes, by name (the module docstring): ``use(name)`` gives the named worker's
    client, ready. ``together``: every worker starts here at once, and all stop at once in ``close``; else each
    starts in ``use`` and stops as its scene ends."""

    def __init__(self, redis_url: str, log_dir: Path, specs: dict[str, WorkerSpec], together: bool):
        self.redis_url, self.log_dir, self.specs, self.together = redis_url, log_dir, specs, together
        self._started: dict[str, StartedWorker] = {}
        if together:
            try:
                for name, spec in specs.items():
                    self._started[name] = StartedWorker(redis_url, spec, log_dir)
            except BaseException:
                self.close()
                raise

    @contextlib.contextmanager
    def use(self, name: str) -> Iterator[OwletClient]:
        started = self._started.get(name) or StartedWorker(self.redis_url, self.specs[name], self.log_dir)
        self._started[name] = started
        try:
            yield started.ready()
        finally:
            if not self.together:
                self._started.pop(name).stop()

    def close(self) -> None:
        """Stop every worker still running: their shutdowns overlap (each a signal first, then the waits)."""
        for started in self._started.values():
            started.process.terminate()
        for started in self._started.values():
            started.stop()
        self._started.clear()

    def __enter__(self) -> "Workers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


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
