"""Fair dispatch: per-user queues in Redis, served round robin, handed to Celery only while workers have room.

Any process may call :meth:`FairDispatch.dispatch` at any time: the client calls it after each submit,
workers call it when a job finishes and on every heartbeat tick. Popping is the POP transition of
``worker.queue.job_states``, so concurrent dispatchers never lose or duplicate a job; a Celery message that
arrives for a job that was meanwhile re-dispatched is ignored by its dispatch number.

Affinity: a follow-up turn goes to the direct queue of the worker that ran the conversation's last
turn (it holds the KV cache) while that worker's heartbeat is alive and it is not saturated.
Otherwise it goes to the shared queue and whichever worker takes it recomputes from history. A conversation's
first question goes likewise to a worker that computed the same prompt's prefix for another conversation
(``worker.queue.prefix_routes``), when one announces it and has a free slot.

A worker whose job ended also takes the next job itself, in the slot that job freed (``JobStates.take``: the same POP,
so the same order and capacity), without a trip through Celery; a job it takes whose conversation another worker holds
is sent on by :meth:`FairDispatch.send`, as here.
"""
from __future__ import annotations

from dataclasses import dataclass

import redis
from celery import Celery
from celery.utils.nodenames import worker_direct

from worker import heartbeat
from worker.store.keys import JobField, Keys, StatField
from worker.queue.job_states import JobStates
from worker.queue.prefix_routes import job_route_keys, pick_worker

RUN_JOB_TASK = "owlet.run_job"


@dataclass(frozen=True)
class FairDispatch:
    r: redis.Redis
    keys: Keys
    jobs: JobStates
    celery: Celery

    def dispatch(self, max_jobs: int = 1000) -> int:
        """Move waiting jobs to Celery, round robin across users, while alive workers have free slots.

        The slots beyond the workers' decode rows are kept for groups with nothing in flight (see POP): there a
        newcomer's question waits inside an engine, which pauses a long answer of a group holding rows for it,
        instead of in Redis behind answers that may run for minutes."""
        workers = heartbeat.alive(self.r, self.keys)
        capacity = sum(w.capacity for w in workers.values())
        rows = sum(w.decode_rows for w in workers.values())
        assigned: dict[str, int] = {}
        sent = 0
        while sent < max_jobs:
            popped = self.jobs.pop(capacity, rows)
            if popped is None:
                break
            self.send(*popped, workers=workers, assigned=assigned)
            sent += 1
        return sent

    def send(self, job_id: str, dispatch_n: int, conv: str, workers: dict | None = None,
             assigned: dict[str, int] | None = None) -> None:
        """Hand a dispatched job to Celery: its conversation's holder's own queue (affinity) or the shared one.
        ``workers``: the live heartbeats (read here when not given); ``assigned``: jobs sent to each holder in this
        pass, which its free slots must still cover."""
        workers = heartbeat.alive(self.r, self.keys) if workers is None else workers
        assigned = {} if assigned is None else assigned
        target = self._affinity_target(conv, workers, assigned) or self._prefix_target(job_id, workers, assigned)
        if target:  # (POP left it "": the shared queue)
            self.r.hset(self.keys.job(job_id), JobField.target, target)
        queue = worker_direct(target) if target else self.keys.celery_queue
        self.celery.send_task(RUN_JOB_TASK, args=[job_id, dispatch_n], queue=queue)

    def count_affinity_hit(self) -> None:
        """A follow-up turn served by the worker that holds its conversation, taken there without a dispatch."""
        self.r.hincrby(self.keys.stats, StatField.affinity_hits, 1)

    def _prefix_target(self, job_id: str, workers: dict, assigned: dict[str, int]) -> str | None:
        """A live worker with a free slot that holds this first question's prompt prefix (``prefix_routes``); None
        for the shared queue. The job's payload is read only while some worker announces prefixes."""
        if not any(beat.prefixes for beat in workers.values()):
            return None
        target = pick_worker(job_route_keys(self.r.hget(self.keys.job(job_id), JobField.payload)), workers, assigned)
        if target:
            assigned[target] = assigned.get(target, 0) + 1
            self.r.hincrby(self.keys.stats, StatField.prefix_route_hits, 1)
        return target

    def _affinity_target(self, conv: str, workers: dict, assigned: dict[str, int]) -> str | None:
        """The worker holding ``conv``'s cache if alive and not saturated; None for the shared queue.

        Only follow-up turns (a holder exists) count towards the affinity hit rate.
        """
        holder = self.r.get(self.keys.holder(conv)) if conv else None
        if holder is None:
            return None
        holder = holder.decode()
        beat = workers.get(holder)
        if beat is not None and beat.load + assigned.get(holder, 0) < beat.capacity:
            assigned[holder] = assigned.get(holder, 0) + 1
            self.r.hincrby(self.keys.stats, StatField.affinity_hits, 1)
            return holder
        self.r.hincrby(self.keys.stats, StatField.affinity_misses, 1)
        return None
