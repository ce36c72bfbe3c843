"""The job state machine: every transition of a job is one named method here, each one Lua script.

    queued ──pop──▶ dispatched ──claim──▶ started ──finish──▶ done | error | cancelled
       ▲                │                    │
       └────requeue─────┴────────────────────┘   (worker lost; after max_attempts: error)

A queued job may also end directly (cancel, queue timeout): queued ──finish──▶ cancelled | error.
Every script (``worker.queue.scripts``) is atomic, so concurrent callers never lose or duplicate a job; this is the
only module that calls them.
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

import redis

from engine.sampling_params import SamplingParams
from worker.config import Settings
from worker.errors import (ClientBusy, ConversationBusy, ImageStoreFull, InvalidInput, NotYourConversation,
                           QuotaExceeded, RateLimited, ServiceBusy, TextQuotaExceeded, UserCapReached)
from worker.store.history import turn_measure
from worker.store.history_budget import history_budget, redis_maxmemory, room_bytes, waiting_room
from worker.store.jobs import TOO_LONG, Job, too_many_images
from worker.store.keys import ENDED_STATES, JobField, JobState, Keys
from worker.store.streams import token_event_data
from worker.queue.fairness import FIFO_QUEUE
from worker.queue.scripts import Scripts, missing_library, settings_json

# Text quota reserved per answer token at admission: a token of the demo's tokenizers is 3-5 bytes of UTF-8 text
# in English, so an answer at its max_new_tokens rarely stores more than this.
ANSWER_BYTES_PER_TOKEN = 4
# SUBMIT's refusal codes (-1, the per-identity cap, carries the cap in its message).
REFUSALS = {-2: ServiceBusy, -3: NotYourConversation, -4: ConversationBusy, -5: ClientBusy, -6: RateLimited,
            -7: QuotaExceeded, -8: QuotaExceeded, -9: TextQuotaExceeded, -10: TextQuotaExceeded,
            -11: ImageStoreFull, -12: ServiceBusy}
# How often a SUBMIT refused by a full Redis is asked again at most, each time after MAKE_ROOM gave room back (a
# thirty-second of the history budget a round: 64 rounds clear twice the budget, so past them what fills Redis is
# not history).
MAKE_ROOM_ROUNDS = 64
# POSITION reads at most this many jobs' places a call (JobStates.places).
PLACES_PER_CALL = 500
# The settings SUBMIT checks and charges, passed to it under their own names.
SUBMIT_SETTINGS = ("user_queue_cap", "group_job_cap", "group_submit_limit",
                   "group_submit_window_s", "image_quota_user_bytes", "image_quota_group_bytes",
                   "image_quota_total_bytes", "image_ttl_s", "text_quota_user_bytes", "text_quota_group_bytes",
                   "text_quota_window_s", "history_ttl_s", "stream_maxlen", "history_max_turns", "history_max_chars",
                   "max_images_per_request")


def new_job_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Admitted:
    """What SUBMIT says of an admitted turn: its place in line, and the job it dispatched in the same step when a
    slot was free (``(job, dispatch_n, conv)``, POP's reply, for the caller to send to Celery), if any."""
    position: int
    dispatched: tuple[str, int, str] | None = None


@dataclass(frozen=True)
class Started:
    """What a worker reads to start a job it has just claimed, returned by the claiming script itself (no further
    round trip): the stored payload (None if missing), the client group, whether its cancel flag is set, the
    conversation the job hash names, that conversation's owner ("" when missing), its turns before the job's
    question (their JSON: a follow-up's history, which its payload does not carry; ``worker.store.jobs``), and the
    question's turn as SUBMIT appended it (None for a job without one)."""
    payload: bytes | None
    group: str
    cancelled: bool
    conv: str
    owner: str
    history: tuple[bytes, ...] = ()
    turn: int | None = None

    @classmethod
    def from_script(cls, fields: list) -> "Started":
        payload, group, cancelled, conv, owner, history, turn = fields
        text = lambda v: v.decode() if isinstance(v, bytes) else str(v)  # noqa: E731
        return cls(payload or None, text(group), bool(int(cancelled)), text(conv), text(owner), tuple(history or ()),
                   int(turn) if int(turn) >= 0 else None)


@dataclass(frozen=True)
class Taken:
    """A job a worker popped for itself (``JobStates.take``): ``started`` when it now runs there; None when another
    worker holds its conversation, so it is dispatched and the caller routes it (``FairDispatch.send``)."""
    job: str
    dispatch_n: int
    conv: str
    started: Started | None
    affinity_hit: bool = False

    @classmethod
    def from_script(cls, popped: list) -> "Taken":
        """From POP's reply when it was given a worker (``worker/queue/lua/pop.lua``)."""
        job, n, conv = popped[0].decode(), int(popped[1]), popped[2].decode()
        if len(popped) == 3:
            return cls(job, n, conv, None)
        return cls(job, n, conv, Started.from_script([*popped[4:9], *popped[10:12]]), bool(int(popped[9])))


class JobStates:
    def __init__(self, r: redis.Redis, keys: Keys, settings: Settings):
        self.r, self.keys, self.settings = r, keys, settings
        self._scripts = Scripts(r, keys)
        maxmemory = redis_maxmemory(r)
        self.history_budget = history_budget(settings, maxmemory)
        self.waiting_room = waiting_room(settings, maxmemory)  # questions that may wait at once, service-wide
        self._settings_cache: dict[str, tuple] = {}  # script -> (settings, budgets, its settings text)

    def enqueue(self, job: Job, turn_json: str | None, group: str | None = None, new_conv: bool = False,
                image: bytes | None = None, image_sha: str | None = None, history: list[str] | None = None,
                expect_turns: int | None = None, index_digest: str | None = None, newest: bool = False,
                notify: str | None = None, slots: tuple[int, int] | None = None) -> Admitted:
        """(new) -> queued (SUBMIT): admit ``job`` and store everything it needs in one atomic step; returns its
        place in line, and the job SUBMIT dispatched when ``slots`` (the workers' capacity and decode rows, as the
        caller last read them) left one free.

        Every cap, rate limit and quota is checked before anything is written, so a refused turn leaves
        nothing behind: not its image, not its conversation, not its turn. With ``turn_json`` the user's
        turn is appended to the conversation (created when ``new_conv``), after checking ownership and that
        no earlier turn is still pending. ``group`` is the client's address (or login); it defaults to the
        user, so callers without addresses get one group per user. ``history``: turns (JSON) a new conversation
        holds before the question (a stateless client's earlier messages). ``expect_turns``: continue only while the
        conversation holds exactly that many turns, else ``ConversationBusy``. ``index_digest``: remember the
        conversation under this digest of a stateless client's messages (``worker.store.conversation_index``);
        ``newest``: as its identity's newest conversation (the page reopens that one). ``notify``: the stream its
        start is announced on (``Keys.started_notices`` of the page following it). Past the history budget, the least
        recently used conversations give way whole (``worker.store.history_budget``).
        """
        answer_tokens = SamplingParams.from_dict(job.sampling).max_new_tokens
        assert not history or new_conv, "only a new conversation is written with earlier turns"
        return self.enqueue_raw(job.job_id, job.user, job.conv, job.to_json(), turn_json, group=group,
                                new_conv=new_conv, image=image, image_sha=image_sha,
                                answer_bytes=answer_tokens * ANSWER_BYTES_PER_TOKEN, history=history or None,
                                expect_turns=expect_turns, index_digest=index_digest, newest=newest, notify=notify,
                                slots=slots)

    def enqueue_raw(self, job_id: str, user: str, conv: str, payload: str, turn_json: str | None = None,
                    group: str | None = None, new_conv: bool = False, image: bytes | None = None,
                    image_sha: str | None = None, answer_bytes: int = 0, history: list[str] | None = None,
                    expect_turns: int | None = None, index_digest: str | None = None, newest: bool = False,
                    notify: str | None = None, slots: tuple[int, int] | None = None) -> Admitted:
        """(new) -> queued with an arbitrary payload (the worker validates it). Used by ``enqueue`` and by tests.

        A Redis at its maxmemory refuses SUBMIT whole (nothing is written); then MAKE_ROOM clears the least
        recently used conversations (and, if they were not enough, the oldest pictures) and the turn is asked
        again, while a round gives room back (``MAKE_ROOM_ROUNDS`` at most). Only when nothing could give way is the
        turn refused as busy."""
        s = self.settings
        group = group or user
        quser, qgroup = (FIFO_QUEUE, FIFO_QUEUE) if s.fifo else (user, group)
        pop_args = self._pop_args(*slots) if slots and slots[0] > 0 else {}
        measured = turn_measure(turn_json) if turn_json else (None, None)  # counted here, not in Redis's one thread
        for _ in range(MAKE_ROOM_ROUNDS + 1):
            try:
                reply = self._scripts.call(
                    self._scripts.submit, bytes(image) if image else b"",
                    job=job_id, user=user, group=group, conv=conv, queue_user=quser, queue_group=qgroup,
                    new_conv=new_conv, payload=payload, now=repr(time.time()), turn=turn_json or "",
                    turn_chars=measured[0], turn_images=measured[1],
                    image_sha=image_sha or "", answer_bytes=answer_bytes, history=history,
                    expect_turns=expect_turns,
                    index_digest=index_digest, newest=newest or None, notify=notify, settings=self._submit_settings(),
                    **pop_args)
                break
            except redis.exceptions.OutOfMemoryError:  # refused whole, nothing written: make room, ask again
                if not self.make_room(keep=conv):
                    raise ServiceBusy() from None
        else:
            raise ServiceBusy()
        code = reply[0]
        if code == -1:
            raise UserCapReached(f"You already have {s.user_queue_cap} questions waiting. Wait for one to "
                                 "finish, then ask again.")
        if code == -13:
            raise InvalidInput(TOO_LONG)
        if code == -14:
            raise InvalidInput(too_many_images(s.max_images_per_request))
        if code in REFUSALS:
            refusal = REFUSALS[code]()
            refusal.retry_after_s = self._retry_after(code, user, group)
            raise refusal
        dispatched = (reply[1].decode(), int(reply[2]), reply[3].decode()) if len(reply) > 1 else None
        return Admitted(int(code), dispatched)

    def _submit_settings(self) -> str:
        """SUBMIT's settings (``Scripts.call``'s ``settings``): the caps and quotas, and the budgets derived from
        them."""
        s = self.settings
        return self._settings_text("submit", (self.history_budget, self.waiting_room), lambda: dict(
            job_ttl_s=int(s.queue_timeout_s + s.job_deadline_s + s.stream_ttl_s),
            history_total_bytes=self.history_budget, global_queue_cap=self.waiting_room,
            **{name: getattr(s, name) for name in SUBMIT_SETTINGS}))

    def _finish_settings(self) -> str:
        """FINISH's settings (``Scripts.call``'s ``settings``)."""
        s = self.settings
        return self._settings_text("finish", (), lambda: dict(holder_ttl_s=s.holder_ttl_s, stream_ttl_s=s.stream_ttl_s,
                                                               stream_maxlen=s.stream_maxlen))

    def _settings_text(self, script: str, budgets: tuple, values) -> str:
        """``script``'s settings as one text (``settings_json`` of ``values()``), made again only when the settings or
        ``budgets`` changed: the same text on every call meanwhile, which the library decodes once."""
        made = self._settings_cache.get(script)
        if made is None or made[0] is not self.settings or made[1] != budgets:
            made = (self.settings, budgets, settings_json(**values()))
            self._settings_cache[script] = made
        return made[2]

    def adopt_line(self) -> int:
        """Put the questions waiting in the line's earlier form into the line (ADOPT_LINE; after an upgrade, once).
        Returns the number of client groups it put in line."""
        return int(self._scripts.call(self._scripts.adopt_line))

    def truncate_conversation(self, conv: str, n_turns: int) -> int:
        """Keep only ``conv``'s first ``n_turns`` turns (TRUNCATE), its history-budget charge with them. Returns the
        turns it holds now."""
        return int(self._scripts.call(self._scripts.truncate, conv=conv, n_turns=n_turns))

    def leave_conversation(self, user: str, conv: str, at: float) -> bool:
        """Record that ``user`` left ``conv`` with "New conversation" at ``at`` (LEAVE); False when the conversation
        is gone or not the user's."""
        return bool(self._scripts.call(self._scripts.leave, user=user, conv=conv, at=repr(float(at))))

    def make_room(self, keep: str = "") -> int:
        """Clear the least recently used conversations not being answered (never ``keep``), and if need be the
        oldest pictures no live job needs, worth ``room_bytes`` of the budget (MAKE_ROOM; it runs over maxmemory).
        Returns the bytes given back: 0 when nothing could go."""
        return int(self._scripts.call(self._scripts.make_room, room_bytes=room_bytes(self.history_budget), keep=keep))

    def _retry_after(self, code: int, user: str, group: str) -> float | None:
        """Seconds until a refused turn could be admitted, where a window says (its key's time to live): the rate
        limit and the quotas. None for caps, which free up when a job ends."""
        k = self.keys
        window = {-6: k.submit_rate(group), -7: k.user_image_quota(user), -8: k.group_image_quota(group),
                  -9: k.user_text_quota(user), -10: k.group_text_quota(group)}.get(code)
        if window is None:
            return None
        try:
            ttl = self.r.ttl(window)
        except redis.RedisError:
            return None
        return float(ttl) if ttl and ttl > 0 else None

    def pop(self, capacity: int, shared: int | None = None) -> tuple[str, int, str] | None:
        """queued -> dispatched (POP): the next job round robin across groups and identities, while fewer than
        ``capacity`` jobs are in flight; beyond ``shared`` in flight (default: all of the capacity), only a group
        with nothing in flight, and in the last ``shared`` slots only such a group that has used the workers little
        lately (see ``worker/queue/lua/pop.lua``). Returns ``(job_id, dispatch_n, conv)``, or None when nothing waits
        or no slot is free."""
        popped = self._scripts.call(self._scripts.pop, now=repr(time.time()), **self._pop_args(capacity, shared))
        if not popped:
            return None
        return popped[0].decode(), int(popped[1]), popped[2].decode()

    @staticmethod
    def _pop_args(capacity: int, shared: int | None) -> dict:
        """POP's slot layout: ``capacity`` jobs in flight at most, the first ``shared`` (the decode rows; default all)
        for anyone, the rest for groups with nothing in flight, past ``light_from`` only light ones."""
        shared = capacity if shared is None else min(shared, capacity)
        return dict(capacity=capacity, shared=shared, light_from=max(shared, capacity - shared))

    def take(self, capacity: int, shared: int | None, worker: str) -> Taken | None:
        """queued -> started on ``worker`` in one step (POP with its ``worker`` argument): the job ``pop`` would hand
        out next, taken by a worker in the slot one of its jobs just freed, without a trip through Celery. A job
        whose conversation another worker holds stays dispatched (``Taken.started`` None). None when nothing waits or
        no slot is free."""
        shared = capacity if shared is None else min(shared, capacity)
        popped = self._scripts.call(self._scripts.pop, capacity=capacity, shared=shared,
                                    light_from=max(shared, capacity - shared), now=repr(time.time()),
                                    worker=worker, stream_maxlen=self.settings.stream_maxlen)
        return Taken.from_script(popped) if popped else None

    def claim(self, job_id: str, dispatch_n: int, worker: str) -> Started | None:
        """dispatched -> started on ``worker`` (CLAIM), with what the worker needs to start it. None for a stale or
        duplicate delivery: skip it."""
        claimed = self._scripts.call(self._scripts.claim, job=job_id, dispatch_n=dispatch_n, worker=worker,
                                     now=repr(time.time()), stream_maxlen=self.settings.stream_maxlen)
        return Started.from_script(claimed[1:8]) if claimed else None

    def finish(self, job_id: str, event_type: str, answer_turn: str | None = None, holder: str | None = None,
               only_state: str = "", only_worker: str = "", service_s: float | None = None, **data) -> bool:
        """queued | dispatched | started -> done | error | cancelled (FINISH): write the terminal event and state
        atomically.

        Returns False when the job had already ended, or is not in ``only_state`` / not owned by
        ``only_worker`` (a runner whose job was re-dispatched must not end the new attempt). ``service_s``: the job's
        run time on its worker, folded into the service-time average (``QueueReadouts``) when the job ends here.
        """
        ended, _ = self.finish_and_take(job_id, event_type, answer_turn, holder, only_state, only_worker, service_s,
                                        **data)
        return ended

    def finish_and_take(self, job_id: str, event_type: str, answer_turn: str | None = None,
                        holder: str | None = None, only_state: str = "", only_worker: str = "",
                        service_s: float | None = None, take: tuple[int, int, str] | None = None,
                        tail: str = "", **data) -> tuple[bool, Taken | None]:
        """``finish``, and with ``take`` = (capacity, shared, worker) the next job ``take`` would give that worker,
        in the same atomic step: the slot the job frees goes to the worker that freed it, before any dispatch pass
        can send it through Celery. ``tail``: the answer's last token text not yet in its stream, written as a token
        event just before the terminal one when the job ends here. Returns (ended, taken)."""
        s = self.settings
        data.setdefault("t", time.time())
        extra = {}
        if take is not None:
            capacity, shared, worker = take
            shared = min(shared, capacity)
            extra = dict(take_capacity=capacity, take_shared=shared, take_light_from=max(shared, capacity - shared),
                         take_worker=worker, now=repr(time.time()))
        done = self._scripts.call(self._scripts.finish, job=job_id, type=event_type, data=json.dumps(data),
                                  answer=answer_turn or "", holder=holder or "", only_state=only_state,
                                  answer_chars=turn_measure(answer_turn)[0] if answer_turn else None,
                                  only_worker=only_worker, service_s=service_s, settings=self._finish_settings(),
                                  tail=token_event_data(tail) if tail else None, **extra)
        if isinstance(done, list):
            return True, Taken.from_script(done[1:])
        return bool(done), None

    def requeue(self, job_id: str, message: str, now: float | None = None, only_state: str | None = None,
                only_worker: str | None = None) -> int:
        """dispatched | started -> queued, or -> error (REQUEUE), for a job whose worker was lost: 1 = back at the
        front of its user's queue, 2 = failed with ``message`` because ``max_attempts`` dispatches were spent,
        3 = cancelled, because its user had stopped it (the lost worker never read the flag), 0 = it was no
        longer dispatched or started. ``only_state`` / ``only_worker``: only while it is still in that state / started
        on that worker (a sweep acts on what it saw, never on a job another worker started meanwhile)."""
        s = self.settings
        now = time.time() if now is None else now
        error = json.dumps({"message": message, "t": now})
        return int(self._scripts.call(self._scripts.requeue, job=job_id, max_attempts=s.max_attempts, now=repr(now),
                                      error=error, stream_ttl_s=s.stream_ttl_s, stream_maxlen=s.stream_maxlen,
                                      only_state=only_state, only_worker=only_worker))

    def cancel(self, job_id: str) -> bool:
        """queued or dispatched -> cancelled at once (FINISH; a worker that receives a cancelled job cannot claim
        it); a started job gets its cancel flag, which its worker relays to the engine (the runner then finishes
        it cancelled), or the reaper honours if that worker is lost. False when it had already ended."""
        state = self.r.hget(self.keys.job(job_id), JobField.state)
        if state is None or state.decode() in ENDED_STATES:
            return False
        state = state.decode()
        if state in (JobState.queued, JobState.dispatched) and self.finish(job_id, JobState.cancelled,
                                                                           only_state=state):
            return True
        # started (or it moved on meanwhile): its worker sees it in its set of stopped jobs within a poll period; the
        # flag also tells a claim that has not started it yet, and the reaper if that worker is lost
        ttl = int(self.settings.job_deadline_s + self.settings.queue_timeout_s)
        worker = self.r.hget(self.keys.job(job_id), JobField.worker)
        with self.r.pipeline(transaction=False) as p:
            p.set(self.keys.cancel(job_id), 1, ex=ttl)
            if worker:
                p.sadd(self.keys.cancels(worker.decode()), job_id)
                p.expire(self.keys.cancels(worker.decode()), ttl)
            p.execute()
        return True

    def position(self, job_id: str) -> int | None:
        """A queued job's 1-based position in the order the queue serves jobs (POSITION, read only); None when it is
        not queued."""
        return self.positions([job_id])[job_id]

    def positions(self, job_ids: list[str]) -> dict[str, int | None]:
        """The positions of many jobs in one round trip (POSITION); None for a job that is not queued."""
        return self.places(job_ids)[0]

    def places(self, job_ids: list[str]) -> tuple[dict[str, int | None], float | None]:
        """Many jobs' positions in one round trip (POSITION: each O(log N) in the N waiting, so a page asks for every
        waiting tab it follows at once), and the seconds each position adds (the service-time average over the decode
        rows; None while unknown). A job that is not queued has position None."""
        job_ids = list(job_ids)
        if not job_ids:
            return {}, None
        # one script call per PLACES_PER_CALL jobs, all in one round trip: a page with thousands waiting never holds
        # Redis for long in one call
        chunks = [job_ids[i:i + PLACES_PER_CALL] for i in range(0, len(job_ids), PLACES_PER_CALL)]
        try:
            replies = self._position_calls(chunks)
        except redis.exceptions.ResponseError as e:  # Redis lost the library: load it, read again (reads only)
            if not missing_library(e):
                raise
            self._scripts.load()
            replies = self._position_calls(chunks)
        per_position = float(replies[0][0]) if replies[0][0] else None
        places = {}
        for chunk, reply in zip(chunks, replies):
            places.update((job, int(place) or None) for job, place in zip(chunk, reply[1:]))
        return places, per_position

    def _position_calls(self, chunks: list[list[str]]) -> list:
        with self.r.pipeline(transaction=False) as p:
            for chunk in chunks:
                self._scripts.call(self._scripts.position, jobs=chunk, client=p)
            return p.execute()
