"""Worker heartbeats: each worker publishes its capacity and load, with a TTL.

A worker whose heartbeat key expired is presumed dead (see ``worker.queue.reaper``).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

import redis

from worker.store.keys import Keys


@dataclass
class Heartbeat:
    worker: str  # Celery node name, e.g. "gpu0@host"; its direct queue is "<worker>.dq2"
    capacity: int  # answers it takes at once: the engine's max_active, at most its Celery threads
    running: int = 0  # answers in decode rows (or prefilling)
    waiting: int = 0  # answers waiting in the engine for a row, paused ones included
    t: float = 0.0
    rows: int = 0  # of the capacity, answers decoded at once (engine max_running); 0: all of it (e.g. the stub)
    model: str = ""  # the served checkpoint's name (its folder's), which the API lists; "" when the engine has none
    prefixes: list[str] = field(default_factory=list)  # route keys of prompts it computed (worker.queue.prefix_routes)

    @property
    def decode_rows(self) -> int:
        return min(self.rows, self.capacity) if self.rows else self.capacity

    @property
    def load(self) -> int:
        return self.running + self.waiting


def publish(r: redis.Redis, keys: Keys, beat: Heartbeat, ttl_s: float) -> None:
    beat.t = time.time()
    with r.pipeline() as p:
        p.set(keys.heartbeat(beat.worker), json.dumps(asdict(beat)), px=int(ttl_s * 1000))
        p.sadd(keys.workers, beat.worker)
        p.execute()


def withdraw(r: redis.Redis, keys: Keys, worker: str) -> None:
    """A clean shutdown: drop the heartbeat at once so nobody routes to this worker, and leave the set of workers
    unless jobs are still recorded as running here (the reaper puts those back in line, then forgets the worker)."""
    r.delete(keys.heartbeat(worker))
    if r.scard(keys.running(worker)) == 0:
        r.srem(keys.workers, worker)


def alive(r: redis.Redis, keys: Keys) -> dict[str, Heartbeat]:
    """Heartbeats of the workers that are alive now, by worker name."""
    names = sorted(n.decode() for n in r.smembers(keys.workers))
    if not names:
        return {}
    raw = r.mget([keys.heartbeat(n) for n in names])
    return {n: _parse(b) for n, b in zip(names, raw) if b is not None}


def other_models(r: redis.Redis, keys: Keys, worker: str, model: str, ttl_s: float,
                 poll_s: float = 0.25) -> list[str]:
    """The checkpoints other than ``model`` that live workers of this queue serve, for ``worker`` about to join it.

    One queue serves one checkpoint: the line does not know models, so a question would be answered by whichever
    worker takes it, and the API would name the model asked for. A heartbeat left by a worker that was killed is not
    refreshed and expires within ``ttl_s``: such a one is waited out, not counted (a restart with another model right
    after ``kill -9`` must still start); one refreshed while this looks is a worker serving now. "" serves nothing
    here (an engine without a checkpoint, e.g. the stub): it neither counts nor is counted."""
    if not model:
        return []
    since, deadline = time.time(), time.monotonic() + ttl_s + poll_s
    while True:
        others = {beat.model: beat.t for name, beat in alive(r, keys).items()
                  if name != worker and beat.model and beat.model != model}
        if not others or any(t >= since for t in others.values()) or time.monotonic() >= deadline:
            return sorted(others)
        time.sleep(poll_s)


def served_models(beats: dict[str, Heartbeat]) -> list[str]:
    """The names of the models the live workers serve (one, in a deployment of one checkpoint)."""
    return sorted({beat.model for beat in beats.values() if beat.model})


def _parse(raw: bytes) -> Heartbeat:
    """Read a heartbeat, ignoring fields this version does not know (a worker of another version may be up)."""
    data = json.loads(raw)
    return Heartbeat(**{k: v for k, v in data.items() if k in Heartbeat.__dataclass_fields__})
