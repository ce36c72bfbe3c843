"""Sweeps that guarantee every job ends: dead workers, lost dispatches, deadlines and queue timeouts.

``Reaper.sweep`` is idempotent and made of atomic transitions (``worker.queue.job_states``), so every worker runs
it on each heartbeat tick and stream readers run it while they wait; whoever comes first does the work.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import redis

from worker import heartbeat
from worker.config import Settings
from worker.store.keys import JobField, JobState, Keys, StatField
from worker.queue.job_states import JobStates

LOST_AFTER_RETRY = ("The worker running your question stopped unexpectedly and a retry failed too. "
                    "Please ask again.")
QUEUE_TIMEOUT = "The service is busy and could not start your question in time. Please try again in a moment."
RUN_TIMEOUT = "Your answer took too long and was stopped. Try a shorter question or fewer tokens."


@dataclass(frozen=True)
class Reaper:
    r: redis.Redis  # heartbeats, the in-flight and queued-since indexes, the workers' running sets
    keys: Keys
    settings: Settings  # heartbeat ttl, job deadline and queue timeout
    jobs: JobStates  # requeue and finish: the only ways the reaper changes a job

    def sweep_if_due(self, every_s: float = 0.5) -> dict[str, int] | None:
        """Sweep unless another process swept within ``every_s``: many waiting readers cost one sweep, not many."""
        if not self.r.set(self.keys.sweep_lock, 1, px=int(every_s * 1000), nx=True):
            return None
        return self.sweep()

    def sweep(self, now: float | None = None) -> dict[str, int]:
        """Run every check once; returns counts of what it did (for logs and tests)."""
        now = time.time() if now is None else now
        counts = {"requeued": 0, "failed": 0, "timed_out": 0}
        alive = heartbeat.alive(self.r, self.keys)
        self._reap_dead_workers(alive, now, counts)
        self._reap_inflight(alive, now, counts)
        self._expire_queued(now, counts)
        if counts["requeued"] or counts["failed"] or counts["timed_out"]:
            self.r.hincrby(self.keys.stats, StatField.reaped, sum(counts.values()))
        return counts

    def _requeue(self, job_id: str, now: float, counts: dict, **seen: str) -> None:
        """Put a lost job back in line, only as it was seen lost (``seen``: its state, or the dead worker it ran on)."""
        code = self.jobs.requeue(job_id, LOST_AFTER_RETRY, now, **seen)
        if code == 1:
            counts["requeued"] += 1
            self.r.hincrby(self.keys.stats, StatField.redispatched, 1)
        elif code == 2:
            counts["failed"] += 1

    def _reap_dead_workers(self, alive: dict, now: float, counts: dict) -> None:
        r, keys = self.r, self.keys
        for raw in r.smembers(keys.workers):
            worker = raw.decode()
            if worker in alive:
                continue
            for job in r.smembers(keys.running(worker)):
                self._requeue(job.decode(), now, counts, only_worker=worker)
            # forget the worker once nothing of it is left; a restart under the same name re-registers it
            if r.scard(keys.running(worker)) == 0:
                r.srem(keys.workers, worker)

    def _reap_inflight(self, alive: dict, now: float, counts: dict) -> None:
        """Dispatched jobs that nobody started (sent to a dead worker's queue, or lost) and runs past their deadline.
        Each sweep reads only the dispatched jobs Celery still carries and the runs old enough to be past it, not
        everything in flight (a started job on a dead worker is its running set's, ``_reap_dead_workers``)."""
        r, keys, s = self.r, self.keys, self.settings
        grace = 3 * s.heartbeat_ttl_s
        unclaimed = r.zrange(keys.unclaimed, 0, -1, withscores=True)
        overdue = r.zrangebyscore(keys.inflight, "-inf", now - s.job_deadline_s - grace)
        with r.pipeline(transaction=False) as p:
            for raw, _ in unclaimed:
                p.hmget(keys.job(raw.decode()), JobField.state, JobField.target)
            for raw in overdue:
                p.hmget(keys.job(raw.decode()), JobField.state, JobField.started_at)
            fields = p.execute()
        for (raw, dispatched_at), (state, target) in zip(unclaimed, fields):
            job = raw.decode()
            if state is None or state.decode() != JobState.dispatched:
                r.zrem(keys.unclaimed, job)  # started or ended meanwhile
                continue
            target = target.decode() if target else ""
            if (target and target not in alive) or now - dispatched_at > grace:
                self._requeue(job, now, counts, only_state=JobState.dispatched)
        for raw, (state, started_at) in zip(overdue, fields[len(unclaimed):]):
            job = raw.decode()
            if state is None:  # the job hash expired under us: nothing to tell anyone
                r.zrem(keys.inflight, job)
            elif state.decode() == JobState.started and started_at and \
                    now - float(started_at) > s.job_deadline_s + grace:
                if self.jobs.finish(job, JobState.error, message=RUN_TIMEOUT, only_state=JobState.started):
                    counts["timed_out"] += 1

    def _expire_queued(self, now: float, counts: dict) -> None:
        cutoff = now - self.settings.queue_timeout_s
        for raw in self.r.zrangebyscore(self.keys.queued_since, "-inf", cutoff):
            if self.jobs.finish(raw.decode(), JobState.error, message=QUEUE_TIMEOUT, only_state=JobState.queued):
                counts["timed_out"] += 1
            else:
                self.r.zrem(self.keys.queued_since, raw)
