"""Fair dispatch: per-user queues in Redis, served round robin, handed to Celery only while workers have room.

Any process may call :meth:`Dispatcher.dispatch` at any time: the client calls it after each submit,
workers call it when a job finishes and on every heartbeat tick. Every queue mutation is one Lua
script (``worker.lua``), so concurrent dispatchers never lose or duplicate a job; a Celery message that
arrives for a job that was meanwhile re-dispatched is ignored by its dispatch number.

Affinity: a follow-up turn goes to the direct queue of the worker that ran the conversation's last
turn (it holds the KV cache) while that worker's heartbeat is alive and it is not saturated.
Otherwise it goes to the shared queue and whichever worker takes it recomputes from history.
"""
from __future__ import annotations

import json
import time
import uuid

import redis
from celery import Celery
from celery.utils.nodenames import worker_direct

from worker import heartbeat
from worker.config import Settings
from worker.errors import (ClientBusy, ConversationBusy, NotYourConversation, QuotaExceeded, RateLimited,
                           ServiceBusy, UserCapReached)
from worker.jobs import Job
from worker.keys import Keys
from worker.lua import Scripts

RUN_JOB_TASK = "owlet.run_job"
FIFO_QUEUE_USER = "*fifo*"  # the single shared queue (and group) of the FIFO baseline
# SUBMIT's refusal codes (-1, the per-identity cap, carries the cap in its message).
REFUSALS = {-2: ServiceBusy, -3: NotYourConversation, -4: ConversationBusy, -5: ClientBusy, -6: RateLimited,
            -7: QuotaExceeded, -8: QuotaExceeded}


class Dispatcher:
    def __init__(self, r: redis.Redis, settings: Settings, celery_app: Celery):
        self.r, self.settings, self.celery = r, settings, celery_app
        self.keys = Keys(settings.key_prefix)
        self.scripts = Scripts(r, self.keys)

    # -- enqueue -------------------------------------------------------------------------------------------
    def enqueue(self, job: Job, turn_json: str | None, group: str | None = None, new_conv: bool = False,
                image: bytes | None = None, image_sha: str | None = None) -> int:
        """Admit ``job`` and store everything it needs in one atomic step; returns its queue position.

        Every cap, rate limit and quota is checked before anything is written, so a refused turn leaves
        nothing behind: not its image, not its conversation, not its turn. With ``turn_json`` the user's
        turn is appended to the conversation (created when ``new_conv``), after checking ownership and that
        no earlier turn is still pending. ``group`` is the client's address (or login); it defaults to the
        user, so callers without addresses get one group per user.
        """
        return self.enqueue_raw(job.job_id, job.user, job.conv, job.to_json(), turn_json, group=group,
                                new_conv=new_conv, image=image, image_sha=image_sha)

    def enqueue_raw(self, job_id: str, user: str, conv: str, payload: str, turn_json: str | None = None,
                    group: str | None = None, new_conv: bool = False, image: bytes | None = None,
                    image_sha: str | None = None) -> int:
        """Enqueue an arbitrary payload (the worker validates it). Used by ``enqueue`` and by tests."""
        s, k = self.settings, self.keys
        group = group or user
        quser, qgroup = (FIFO_QUEUE_USER, FIFO_QUEUE_USER) if s.fifo else (user, group)
        ttl = int(s.queue_timeout_s + s.job_deadline_s + s.stream_ttl_s)
        per_position = self.seconds_per_position()
        extra = [k.job(job_id), k.stream(job_id), k.conversation(conv), k.turns(conv), k.image(image_sha or ""),
                 k.image_quota("u:" + user), k.image_quota("g:" + group), k.submit_rate(group)]
        try:
            (code,) = self.scripts.call(
                self.scripts.submit, job_id, user, quser, group, qgroup, conv, "1" if new_conv else "0", payload,
                repr(time.time()), s.user_queue_cap, s.group_job_cap, s.global_queue_cap, s.stream_maxlen, ttl,
                turn_json or "", "" if per_position is None else repr(per_position), s.history_ttl_s,
                bytes(image) if image else b"", s.image_ttl_s, s.image_quota_user_bytes, s.image_quota_group_bytes,
                s.group_submit_limit, s.group_submit_window_s, extra_keys=extra)
        except redis.exceptions.OutOfMemoryError:  # Redis is full: the script was refused whole, nothing written
            raise ServiceBusy() from None
        if code == -1:
            raise UserCapReached(f"You already have {s.user_queue_cap} questions waiting. Wait for one to "
                                 "finish, then ask again.")
        if code in REFUSALS:
            raise REFUSALS[code]()
        return int(code)

    @staticmethod
    def new_job_id() -> str:
        return uuid.uuid4().hex

    # -- dispatch ------------------------------------------------------------------------------------------
    def dispatch(self, max_jobs: int = 1000) -> int:
        """Move waiting jobs to Celery, round robin across users, while alive workers have free slots."""
        workers = heartbeat.alive(self.r, self.keys)
        capacity = sum(w.capacity for w in workers.values())
        assigned: dict[str, int] = {}
        sent = 0
        while sent < max_jobs:
            popped = self.scripts.call(self.scripts.pop, capacity, repr(time.time()))
            if not popped:
                break
            job_id, dispatch_n, conv = popped[0].decode(), int(popped[1]), popped[2].decode()
            target = self._affinity_target(conv, workers, assigned)
            self.r.hset(self.keys.job(job_id), "target", target or "")
            queue = worker_direct(target) if target else self.keys.celery_queue
            self.celery.send_task(RUN_JOB_TASK, args=[job_id, dispatch_n], queue=queue)
            sent += 1
        return sent

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
            self.r.hincrby(self.keys.stats, "affinity_hits", 1)
            return holder
        self.r.hincrby(self.keys.stats, "affinity_misses", 1)
        return None

    # -- estimates -----------------------------------------------------------------------------------------
    def record_service_time(self, seconds: float) -> None:
        """Fold one job's run time into a moving average (a lost update between workers is harmless)."""
        old = self.r.get(self.keys.service_time)
        new = seconds if old is None else 0.8 * float(old) + 0.2 * seconds
        self.r.set(self.keys.service_time, repr(new))

    def seconds_per_position(self) -> float | None:
        """Expected seconds each queue position adds: mean service time over the live workers' slots."""
        service = self.r.get(self.keys.service_time)
        if service is None:
            return None
        capacity = sum(w.capacity for w in heartbeat.alive(self.r, self.keys).values())
        return float(service) / capacity if capacity else None

    def eta_s(self, position: int | None) -> float | None:
        """The one queue ETA: seconds until a job at ``position`` should start (None while unknown)."""
        per_position = self.seconds_per_position()
        return None if position is None or per_position is None else round(position * per_position, 1)

    # -- reading -------------------------------------------------------------------------------------------
    def position(self, job_id: str) -> int | None:
        pos = self.scripts.call(self.scripts.position, job_id)
        return int(pos) if pos is not None else None

    def queued_total(self) -> int:
        return int(self.r.get(self.keys.queued_count) or 0)

    def queue_stats(self, now: float | None = None) -> dict:
        """Aggregates only (no identities, no addresses): what /metrics may show about the queue."""
        now = time.time() if now is None else now
        with self.r.pipeline(transaction=False) as p:
            p.get(self.keys.queued_count)
            p.llen(self.keys.ring)
            p.zrange(self.keys.queued_since, 0, 0, withscores=True)
            p.zcard(self.keys.inflight)
            queued, groups, oldest, inflight = p.execute()
        return {"queued": int(queued or 0), "waiting_clients": int(groups),
                "oldest_wait_s": max(0.0, now - oldest[0][1]) if oldest else 0.0, "in_flight": int(inflight)}

    def affinity_stats(self) -> dict:
        raw = self.r.hgetall(self.keys.stats)
        stats = {k.decode(): int(v) for k, v in raw.items()}
        hits, misses = stats.get("affinity_hits", 0), stats.get("affinity_misses", 0)
        stats["affinity_hit_rate"] = hits / (hits + misses) if hits + misses else None
        return stats

    # -- ending a job --------------------------------------------------------------------------------------
    def finish(self, job_id: str, event_type: str, answer_turn: str | None = None, holder: str | None = None,
               only_state: str = "", only_worker: str = "", **data) -> bool:
        """Write the terminal event and state atomically.

        Returns False when the job had already ended, or is not in ``only_state`` / not owned by
        ``only_worker`` (a runner whose job was re-dispatched must not end the new attempt).
        """
        s = self.settings
        data.setdefault("t", time.time())
        done = self.scripts.call(self.scripts.finish, job_id, event_type, json.dumps(data), answer_turn or "",
                                 s.stream_ttl_s, s.stream_maxlen, holder or "", only_state, only_worker,
                                 s.holder_ttl_s)
        return bool(done)

    def claim(self, job_id: str, dispatch_n: int, worker: str) -> bool:
        """dispatched -> started on ``worker`` (CLAIM). False for a stale or duplicate delivery: skip it."""
        return bool(self.scripts.call(self.scripts.claim, job_id, dispatch_n, worker, repr(time.time()),
                                      self.settings.stream_maxlen))

    def requeue(self, job_id: str, message: str, now: float | None = None) -> int:
        """A job whose worker was lost (REQUEUE): 1 = back at the front of its user's queue, 2 = failed with
        ``message`` because ``max_attempts`` dispatches were spent, 0 = it was no longer dispatched or started."""
        s = self.settings
        now = time.time() if now is None else now
        error = json.dumps({"message": message, "t": now})
        return int(self.scripts.call(self.scripts.requeue, job_id, s.max_attempts, repr(now), s.stream_maxlen,
                                     s.stream_ttl_s, error))

    def cancel(self, job_id: str) -> bool:
        """Cancel a job: a queued one ends at once; a dispatched or running one gets its cancel flag,
        which its worker relays to the engine. Returns False when the job had already ended."""
        state = self.r.hget(self.keys.job(job_id), "state")
        if state is None or state.decode() in ("done", "error", "cancelled"):
            return False
        if state.decode() == "queued" and self.finish(job_id, "cancelled", only_state="queued"):
            return True
        # dispatched/started (or it was popped meanwhile): the worker sees the flag within a poll period
        self.r.set(self.keys.cancel(job_id), 1, ex=int(self.settings.job_deadline_s + self.settings.queue_timeout_s))
        return True
