"""Sweeps that guarantee every job ends: dead workers, lost dispatches, deadlines and queue timeouts.

``sweep`` is idempotent and made of atomic scripts, so every worker runs it on each heartbeat tick and
stream readers run it while they wait; whoever comes first does the work.
"""
from __future__ import annotations

import time

from worker import heartbeat
from worker.dispatcher import Dispatcher

LOST_AFTER_RETRY = ("The worker running your question stopped unexpectedly and a retry failed too. "
                    "Please ask again.")
QUEUE_TIMEOUT = "The service is busy and could not start your question in time. Please try again in a moment."
RUN_TIMEOUT = "Your answer took too long and was stopped. Try a shorter question or fewer tokens."


def sweep_if_due(d: Dispatcher, every_s: float = 0.5) -> dict[str, int] | None:
    """Sweep unless another process swept within ``every_s``: many waiting readers cost one sweep, not many."""
    if not d.r.set(d.keys.sweep_lock, 1, px=int(every_s * 1000), nx=True):
        return None
    return sweep(d)


def sweep(d: Dispatcher, now: float | None = None) -> dict[str, int]:
    """Run every check once; returns counts of what it did (for logs and tests)."""
    now = time.time() if now is None else now
    counts = {"requeued": 0, "failed": 0, "timed_out": 0}
    alive = heartbeat.alive(d.r, d.keys)
    _reap_dead_workers(d, alive, now, counts)
    _reap_inflight(d, alive, now, counts)
    _expire_queued(d, now, counts)
    if counts["requeued"] or counts["failed"] or counts["timed_out"]:
        d.r.hincrby(d.keys.stats, "reaped", sum(counts.values()))
    return counts


def _requeue(d: Dispatcher, job_id: str, now: float, counts: dict) -> None:
    code = d.requeue(job_id, LOST_AFTER_RETRY, now)
    if code == 1:
        counts["requeued"] += 1
        d.r.hincrby(d.keys.stats, "redispatched", 1)
    elif code == 2:
        counts["failed"] += 1


def _reap_dead_workers(d: Dispatcher, alive: dict, now: float, counts: dict) -> None:
    for raw in d.r.smembers(d.keys.workers):
        worker = raw.decode()
        if worker in alive:
            continue
        for job in d.r.smembers(d.keys.running(worker)):
            _requeue(d, job.decode(), now, counts)
        # forget the worker once nothing of it is left; a restart under the same name re-registers it
        if d.r.scard(d.keys.running(worker)) == 0:
            d.r.srem(d.keys.workers, worker)


def _reap_inflight(d: Dispatcher, alive: dict, now: float, counts: dict) -> None:
    """Dispatched jobs that nobody started (sent to a dead worker's queue, or lost) and runs past deadline."""
    s = d.settings
    grace = 3 * s.heartbeat_ttl_s
    for raw, dispatched_at in d.r.zrange(d.keys.inflight, 0, -1, withscores=True):
        job = raw.decode()
        state, target, worker, started_at = d.r.hmget(d.keys.job(job), "state", "target", "worker", "started_at")
        state = state.decode() if state else None
        if state == "dispatched":
            target = target.decode() if target else ""
            if (target and target not in alive) or now - dispatched_at > grace:
                _requeue(d, job, now, counts)
        elif state == "started":
            worker = worker.decode() if worker else ""
            if worker not in alive:
                _requeue(d, job, now, counts)
            elif started_at and now - float(started_at) > s.job_deadline_s + grace:
                if d.finish(job, "error", message=RUN_TIMEOUT, only_state="started"):
                    counts["timed_out"] += 1
        elif state is None:  # the job hash expired under us: nothing to tell anyone
            d.r.zrem(d.keys.inflight, job)


def _expire_queued(d: Dispatcher, now: float, counts: dict) -> None:
    cutoff = now - d.settings.queue_timeout_s
    for raw in d.r.zrangebyscore(d.keys.queued_since, "-inf", cutoff):
        if d.finish(raw.decode(), "error", message=QUEUE_TIMEOUT, only_state="queued"):
            counts["timed_out"] += 1
        else:
            d.r.zrem(d.keys.queued_since, raw)
