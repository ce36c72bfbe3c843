"""The job state machine: every transition of a job is one named method here, each one Lua script.

    queued ──pop──▶ dispatched ──claim──▶ started ──finish──▶ done | error | cancelled
       ▲                │                    │
       └────requeue─────┴────────────────────┘   (worker lost; after max_attempts: error)

A queued job may also end directly (cancel, queue timeout): queued ──finish──▶ cancelled | error.
Every script (``worker.lua``) is atomic, so concurrent callers never lose or duplicate a job; this is the
only module that calls them.
"""
from __future__ import annotations

import json
import time
import uuid

import redis

from engine.sampling_params import SamplingParams
from worker.config import Settings
from worker.errors import (ClientBusy, ConversationBusy, ImageStoreFull, NotYourConversation, QuotaExceeded,
                           RateLimited, ServiceBusy, TextQuotaExceeded, UserCapReached)
from worker.jobs import Job
from worker.keys import Keys
from worker.lua import Scripts
from worker.queue_readouts import QueueReadouts

# Text quota reserved per answer token at admission: a token of the demo's tokenizers is 3-5 bytes of UTF-8 text
# in English, so an answer at its max_new_tokens rarely stores more than this.
ANSWER_BYTES_PER_TOKEN = 4
TOTAL_IMAGES = "*all*"  # bytes of images the whole service holds now (identities' quotas are "u:…", groups' "g:…")
FIFO_QUEUE_USER = "*fifo*"  # the single shared queue (and group) of the FIFO baseline
# SUBMIT's refusal codes (-1, the per-identity cap, carries the cap in its message).
REFUSALS = {-2: ServiceBusy, -3: NotYourConversation, -4: ConversationBusy, -5: ClientBusy, -6: RateLimited,
            -7: QuotaExceeded, -8: QuotaExceeded, -9: TextQuotaExceeded, -10: TextQuotaExceeded,
            -11: ImageStoreFull}
ENDED = ("done", "error", "cancelled")


def new_job_id() -> str:
    return uuid.uuid4().hex


class JobStates:
    def __init__(self, r: redis.Redis, keys: Keys, settings: Settings, readouts: QueueReadouts):
        self.r, self.keys, self.settings, self.readouts = r, keys, settings, readouts
        self._scripts = Scripts(r, keys)

    def enqueue(self, job: Job, turn_json: str | None, group: str | None = None, new_conv: bool = False,
                image: bytes | None = None, image_sha: str | None = None) -> int:
        """(new) -> queued (SUBMIT): admit ``job`` and store everything it needs in one atomic step; returns its
        queue position.

        Every cap, rate limit and quota is checked before anything is written, so a refused turn leaves
        nothing behind: not its image, not its conversation, not its turn. With ``turn_json`` the user's
        turn is appended to the conversation (created when ``new_conv``), after checking ownership and that
        no earlier turn is still pending. ``group`` is the client's address (or login); it defaults to the
        user, so callers without addresses get one group per user.
        """
        answer_tokens = SamplingParams.from_dict(job.sampling).max_new_tokens
        return self.enqueue_raw(job.job_id, job.user, job.conv, job.to_json(), turn_json, group=group,
                                new_conv=new_conv, image=image, image_sha=image_sha,
                                answer_bytes=answer_tokens * ANSWER_BYTES_PER_TOKEN)

    def enqueue_raw(self, job_id: str, user: str, conv: str, payload: str, turn_json: str | None = None,
                    group: str | None = None, new_conv: bool = False, image: bytes | None = None,
                    image_sha: str | None = None, answer_bytes: int = 0) -> int:
        """(new) -> queued with an arbitrary payload (the worker validates it). Used by ``enqueue`` and by tests."""
        s, k = self.settings, self.keys
        group = group or user
        quser, qgroup = (FIFO_QUEUE_USER, FIFO_QUEUE_USER) if s.fifo else (user, group)
        ttl = int(s.queue_timeout_s + s.job_deadline_s + s.stream_ttl_s)
        per_position = self.readouts.seconds_per_position()
        extra = [k.job(job_id), k.stream(job_id), k.conversation(conv), k.turns(conv), k.image(image_sha or ""),
                 k.image_quota("u:" + user), k.image_quota("g:" + group), k.submit_rate(group),
                 k.text_quota("u:" + user), k.text_quota("g:" + group), k.image_quota(TOTAL_IMAGES),
                 k.images_held(), k.image_sizes(), k.image_holders(), k.image_owners()]
        try:
            (code,) = self._scripts.call(
                self._scripts.submit, job_id, user, quser, group, qgroup, conv, "1" if new_conv else "0", payload,
                repr(time.time()), s.user_queue_cap, s.group_job_cap, s.global_queue_cap, s.stream_maxlen, ttl,
                turn_json or "", "" if per_position is None else repr(per_position), s.history_ttl_s,
                bytes(image) if image else b"", s.image_ttl_s, s.image_quota_user_bytes, s.image_quota_group_bytes,
                s.group_submit_limit, s.group_submit_window_s, s.text_quota_user_bytes, s.text_quota_group_bytes,
                s.text_quota_window_s, answer_bytes, s.image_quota_total_bytes, extra_keys=extra)
        except redis.exceptions.OutOfMemoryError:  # Redis is full: the script was refused whole, nothing written
            raise ServiceBusy() from None
        if code == -1:
            raise UserCapReached(f"You already have {s.user_queue_cap} questions waiting. Wait for one to "
                                 "finish, then ask again.")
        if code in REFUSALS:
            raise REFUSALS[code]()
        return int(code)

    def pop(self, capacity: int, shared: int | None = None) -> tuple[str, int, str] | None:
        """queued -> dispatched (POP): the next job round robin across groups and identities, while fewer than
        ``capacity`` jobs are in flight; beyond ``shared`` in flight (default: all of the capacity), only a group
        with nothing in flight. Returns ``(job_id, dispatch_n, conv)``, or None when nothing waits or no slot is
        free."""
        shared = capacity if shared is None else min(shared, capacity)
        popped = self._scripts.call(self._scripts.pop, capacity, repr(time.time()), shared)
        if not popped:
            return None
        return popped[0].decode(), int(popped[1]), popped[2].decode()

    def claim(self, job_id: str, dispatch_n: int, worker: str) -> bool:
        """dispatched -> started on ``worker`` (CLAIM). False for a stale or duplicate delivery: skip it."""
        return bool(self._scripts.call(self._scripts.claim, job_id, dispatch_n, worker, repr(time.time()),
                                       self.settings.stream_maxlen))

    def finish(self, job_id: str, event_type: str, answer_turn: str | None = None, holder: str | None = None,
               only_state: str = "", only_worker: str = "", **data) -> bool:
        """queued | dispatched | started -> done | error | cancelled (FINISH): write the terminal event and state
        atomically.

        Returns False when the job had already ended, or is not in ``only_state`` / not owned by
        ``only_worker`` (a runner whose job was re-dispatched must not end the new attempt).
        """
        s = self.settings
        data.setdefault("t", time.time())
        done = self._scripts.call(self._scripts.finish, job_id, event_type, json.dumps(data), answer_turn or "",
                                  s.stream_ttl_s, s.stream_maxlen, holder or "", only_state, only_worker,
                                  s.holder_ttl_s)
        return bool(done)

    def requeue(self, job_id: str, message: str, now: float | None = None) -> int:
        """dispatched | started -> queued, or -> error (REQUEUE), for a job whose worker was lost: 1 = back at the
        front of its user's queue, 2 = failed with ``message`` because ``max_attempts`` dispatches were spent,
        3 = cancelled, because its user had stopped it (the lost worker never read the flag), 0 = it was no
        longer dispatched or started."""
        s = self.settings
        now = time.time() if now is None else now
        error = json.dumps({"message": message, "t": now})
        return int(self._scripts.call(self._scripts.requeue, job_id, s.max_attempts, repr(now), s.stream_maxlen,
                                      s.stream_ttl_s, error))

    def cancel(self, job_id: str) -> bool:
        """queued or dispatched -> cancelled at once (FINISH; a worker that receives a cancelled job cannot claim
        it); a started job gets its cancel flag, which its worker relays to the engine (the runner then finishes
        it cancelled), or the reaper honours if that worker is lost. False when it had already ended."""
        state = self.r.hget(self.keys.job(job_id), "state")
        if state is None or state.decode() in ENDED:
            return False
        state = state.decode()
        if state in ("queued", "dispatched") and self.finish(job_id, "cancelled", only_state=state):
            return True
        # started (or it moved on meanwhile): the worker sees the flag within a poll period
        self.r.set(self.keys.cancel(job_id), 1, ex=int(self.settings.job_deadline_s + self.settings.queue_timeout_s))
        return True

    def position(self, job_id: str) -> int | None:
        """A queued job's 1-based position among all waiting jobs (POSITION, read only); None when not queued."""
        pos = self._scripts.call(self._scripts.position, job_id)
        return int(pos) if pos is not None else None
