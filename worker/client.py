"""``OwletClient``: the API the UI and benchmarks use (see docs/interfaces.md).

It stores images and history, submits fair jobs, runs a dispatch pass after each submit, and reads job
streams. Errors raised to callers are ``worker.errors.OwletError`` subclasses carrying ``.user_message``.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass

import redis

from engine.sampling_params import SamplingParams
from worker import heartbeat
from worker.celery_app import create_app
from worker.config import Settings
from worker.store.conversation_index import ConversationIndex, digest
from worker.errors import ConversationBusy, ImageMissing, InvalidInput, NotYourConversation, UnknownJob
from worker.store.history import ConversationStore, turn_json
from worker.store.images import ImageStore
from worker.store.jobs import ROLES, TOO_LONG, Job, Message, check_image_count, check_texts_encode
from worker.store.keys import LIVE_STATES, ConvField, JobField, Keys
from worker.queue.dispatch import FairDispatch
from worker.queue.job_states import JobStates, new_job_id
from worker.queue.readouts import QueueReadouts
from worker.queue.reaper import Reaper
from worker.store.stream_reader import StreamReader

# A stateless request that starts a conversation stores every picture it names in one admission, which takes one.
ONE_NEW_PICTURE = ("A request may send one picture the server does not hold yet. Ask about a new picture in a new "
                   "conversation, or continue the conversation that already holds the others.")


@dataclass(frozen=True)
class Submitted:
    """What an admitted turn created: its job, its conversation (new or given) and its image's sha256."""
    job: str
    conv: str
    image_sha: str | None


class OwletClient:
    def __init__(self, redis_url: str | None = None, settings: Settings | None = None):
        if settings is None:
            settings = Settings.from_env(**({"redis_url": redis_url} if redis_url else {}))
        self.settings = settings
        self.keys = Keys(settings.key_prefix)
        self.r = redis.Redis.from_url(settings.redis_url)
        self.readouts = QueueReadouts(self.r, self.keys)
        self.jobs = JobStates(self.r, self.keys, settings)
        self.fair = FairDispatch(self.r, self.keys, self.jobs, create_app(settings))
        self.reaper = Reaper(self.r, self.keys, settings, self.jobs)
        self.images = ImageStore(self.r, self.keys, settings.image_ttl_s, settings.image_max_bytes)
        self.convs = ConversationStore(self.r, self.keys, settings.history_ttl_s)
        self.conversations = ConversationIndex(self.r, self.keys, self.convs, settings.history_ttl_s)
        # Job streams, for a lone reader (``events``) and for the page's one reader of many (ui.chat.stream_hub).
        self.stream_reader = StreamReader(self.r, self.keys, self.jobs, self.reaper, settings.read_block_ms,
                                          settings.redis_reconnect_s)
        self._alive, self._alive_read_at = {}, float("-inf")  # the live workers' heartbeats, as last read
        self._models, self._models_read_at = [], float("-inf")  # served_models' last reading

    # -- conversations and images --------------------------------------------------------------------------
    def put_image(self, png_bytes: bytes) -> str:
        return self.images.put(png_bytes)

    def new_conversation(self, user_id: str) -> str:
        _check_user(user_id)
        return self.convs.create(user_id)

    def history(self, user_id: str, conv: str) -> list[dict]:
        """The conversation's turns ``{role, text, image_sha}``; raises NotYourConversation."""
        self.convs.check_owner(user_id, conv)
        return [{k: t.get(k) for k in ("role", "text", "image_sha")} for t in self.convs.turns(conv)]

    def conversation_images(self, user_id: str, conv: str) -> dict[str, bytes]:
        """The stored bytes of the conversation's pictures, by sha256 (those not yet expired); raises
        NotYourConversation. For showing them again in a reopened chat."""
        self.convs.check_owner(user_id, conv)
        shas = list(dict.fromkeys(t["image_sha"] for t in self.convs.turns(conv) if t.get("image_sha")))
        if not shas:
            return {}
        return {sha: data for sha, data in zip(shas, self.r.mget([self.keys.image(sha) for sha in shas]))
                if data is not None}

    def pending_job(self, user_id: str, conv: str) -> str | None:
        """The job answering the conversation's last question while it is queued or running, else None; raises
        NotYourConversation."""
        self.convs.check_owner(user_id, conv)
        pending = self.r.hget(self.keys.conversation(conv), ConvField.pending)
        if pending is None:
            return None
        job = pending.decode()
        return job if self.job_state(job) in LIVE_STATES else None

    def first_answer(self, user_id: str) -> tuple[str, str] | None:
        """``(conversation, job)`` while the identity's newest conversation is still answering its first
        question, else None. A browser learns a new conversation's id only when that answer ends, so a page
        reloaded before then finds the conversation here."""
        _check_user(user_id)
        conv = self.r.get(self.keys.newest_conversation(user_id))
        if conv is None:
            return None
        conv = conv.decode()
        try:
            job = self.pending_job(user_id, conv)
        except NotYourConversation:  # expired since
            return None
        if job is None or self.r.llen(self.keys.turns(conv)) != 1:
            return None
        return conv, job

    def newest_since(self, user_id: str, since: float) -> str | None:
        """The identity's newest conversation (the page's newest chat) if it was created after ``since`` (the caller's
        clock, in seconds; -inf: whenever), while it is still the identity's; else None. A browser remembers a chat
        one step after its answer's last update, so a page reloaded in between finds here the chat it does not know
        yet, answered or not; one created before the browser last remembered (and left with "New conversation") is
        not returned."""
        _check_user(user_id)
        conv = self.r.get(self.keys.newest_conversation(user_id))
        if conv is None:
            return None
        owner, created = self.r.hmget(self.keys.conversation(conv.decode()), ConvField.user, ConvField.created)
        if owner is None or owner.decode() != user_id:
            return None
        try:
            if not float(created) > since:
                return None
        except (TypeError, ValueError):  # no creation time: not known to be newer
            return None
        return conv.decode()

    def leave(self, user_id: str, conv: str, at: float) -> bool:
        """Record that the identity left its conversation ``conv`` with "New conversation" at ``at`` (the caller's
        clock, the one ``newest_since`` compares with); False when it is gone or not the identity's. A page reloaded
        before its browser kept that it left does not reopen it (``left_at``)."""
        _check_user(user_id)
        return self.jobs.leave_conversation(user_id, conv, at)

    def left_at(self, user_id: str, conv: str) -> float | None:
        """When the identity last left its conversation ``conv`` with "New conversation" (``leave``), or None: never,
        or it is gone or not the identity's."""
        _check_user(user_id)
        owner, left = self.r.hmget(self.keys.conversation(conv), ConvField.user, ConvField.left)
        if owner is None or owner.decode() != user_id or left is None:
            return None
        try:
            return float(left)
        except ValueError:
            return None

    def truncate(self, user_id: str, conv: str, n_turns: int) -> None:
        """Drop turns after the first ``n_turns`` (retry / edit). Refused while a turn is being answered."""
        self.convs.check_owner(user_id, conv)
        if not isinstance(n_turns, int) or n_turns < 0:
            raise InvalidInput("n_turns must be a non-negative integer.")
        pending = self.r.hget(self.keys.conversation(conv), ConvField.pending)
        if pending is not None:
            self.cancel(user_id, pending.decode())
        self.jobs.truncate_conversation(conv, n_turns)

    # -- jobs ----------------------------------------------------------------------------------------------
    def submit_turn(self, user_id: str, conv: str, text: str, image_sha: str | None = None,
                    sampling: dict | None = None) -> str:
        """Append the user's turn to an existing conversation and enqueue a fair job; returns the job id."""
        return self.submit(user_id, conv, text, image_sha=image_sha, sampling=sampling).job

    def submit(self, user_id: str, conv: str | None, text: str, image: bytes | None = None,
               image_sha: str | None = None, sampling: dict | None = None, group: str | None = None,
               notify: str | None = None) -> "Submitted":
        """Admit one turn: check every limit first, then store the new image (``image`` bytes), create the
        conversation (``conv`` None), append the turn and enqueue the job, all in one atomic step.

        ``group`` is the client group for fairness and per-address limits (the page passes the client's
        address, or the login); it defaults to ``user_id``. A refused turn raises an ``OwletError`` and
        leaves nothing stored. ``image_sha`` refers to an image stored by an earlier turn (retry, edit).
        ``notify``: the stream the job's start is announced on (the following page's ``StreamHub.started_key``).
        """
        _check_caller(user_id, group)
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("Please type a question.")
        check_texts_encode([Message("user", text)], sampling)
        if image is not None:
            image_sha = self.images.check(image)
        elif image_sha is not None and not self.images.exists(image_sha):
            raise ImageMissing()
        # A follow-up reads nothing first: SUBMIT checks the conversation's owner and the history limits on the sums
        # it keeps, and the worker gets the turns with the job (past None).
        return self._admit(user_id, group, conv, () if conv is None else None, Message("user", text, image_sha), image,
                           image_sha, sampling, notify=notify)

    def submit_messages(self, user_id: str, messages, images: dict[str, bytes] | None = None,
                        sampling: dict | None = None, group: str | None = None,
                        notify: str | None = None) -> "Submitted":
        """Admit a stateless client's turn: ``messages`` (``worker.store.jobs.Message``) is the whole conversation, ending
        with the user's new question, and ``images`` the bytes of every picture they name, by sha256.

        It continues the identity's stored conversation whose turns equal every message before the question, so
        the worker's session cache serves what was computed before (``worker.store.conversation_index``); otherwise it
        starts a new conversation holding all of them. Only pictures that conversation does not hold are sent to
        storage (and charged), at most one per request. Limits, refusals and atomicity are ``submit``'s.
        """
        _check_caller(user_id, group)
        messages = tuple(messages)
        if not messages or messages[-1].role != "user":
            raise InvalidInput("The last message must be the user's question.")
        if any(m.role not in ROLES or not isinstance(m.text, str) for m in messages):
            raise InvalidInput(f"Each message needs a role ({', '.join(ROLES)}) and a text.")
        check_texts_encode(messages, sampling)
        earlier, question = messages[:-1], messages[-1]
        if not question.text.strip() and not question.image_sha:
            raise InvalidInput("The last message is empty: ask a question, or send a picture to ask about.")
        images = dict(images or {})
        named = list(dict.fromkeys(m.image_sha for m in messages if m.image_sha))
        if any(sha not in images for sha in named):
            raise InvalidInput("A message names a picture whose bytes were not sent.")
        conv = self.conversations.find(user_id, earlier)
        while True:
            held = {m.image_sha for m in earlier if m.image_sha} if conv is not None else set()
            to_send = [sha for sha in named if sha not in held or not self.images.exists(sha)]
            if len(to_send) > 1:
                raise InvalidInput(ONE_NEW_PICTURE)
            image = images[to_send[0]] if to_send else None
            if image is not None and self.images.check(image) != to_send[0]:
                raise InvalidInput("A picture's bytes do not match the sha256 it is named by.")
            try:
                submitted = self._admit(user_id, group, conv, earlier, question, image,
                                        to_send[0] if to_send else question.image_sha, sampling,
                                        expect_turns=len(earlier) if conv is not None else None, newest=False,
                                        index_digest=digest(messages), notify=notify)
            except (ConversationBusy, NotYourConversation):
                if conv is None:
                    raise
                # it changed, expired or gave way to the history budget since it was matched: the messages, which
                # hold all of it, start a new one
                conv = None
                continue
            break
        return submitted

    def _admit(self, user_id: str, group: str | None, conv: str | None, past: tuple[Message, ...] | None,
               question: Message, image: bytes | None, image_sha: str | None, sampling: dict | None,
               expect_turns: int | None = None, newest: bool = True,
               index_digest: str | None = None, notify: str | None = None) -> "Submitted":
        """Check the turn against the history limits and enqueue it (SUBMIT, which checks them too, on what the
        conversation holds). ``conv`` None: a new conversation holding ``past`` before the question; otherwise
        ``past`` is what ``conv`` holds, or None when it was not read (a follow-up of the page's: its job carries its
        question alone, and SUBMIT gives its turn). ``image``: bytes to store
        with it (sha256 ``image_sha``); without bytes, ``image_sha`` is a stored picture the turn keeps alive.
        ``newest``: remember it as the identity's newest conversation (the page reopens that one on reload);
        ``index_digest``: under this digest of a stateless client's messages (``worker.store.conversation_index``)."""
        s = self.settings
        if len(question.text) > s.turn_max_chars:
            raise InvalidInput(f"The question is too long ({len(question.text)} characters, limit "
                               f"{s.turn_max_chars}).")
        try:
            SamplingParams.from_dict(sampling)
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"Invalid generation settings: {exc}") from None
        new_conv = conv is None
        if new_conv:
            conv = self.convs.new_id()
        messages = (past or ()) + (question,)
        if len(messages) > s.history_max_turns or sum(len(m.text) for m in messages) > s.history_max_chars:
            raise InvalidInput(TOO_LONG)
        check_image_count(messages, s.max_images_per_request)
        job_id = new_job_id()
        job = Job(job_id, user_id, conv, None if past is None else len(past), messages, dict(sampling or {}))
        history = [turn_json(m.role, m.text, m.image_sha) for m in past] if new_conv else None
        workers = self._workers()
        slots = (sum(w.capacity for w in workers.values()), sum(w.decode_rows for w in workers.values()))
        try:
            admitted = self.jobs.enqueue(job, turn_json("user", question.text, question.image_sha, job_id), group=group,
                                         new_conv=new_conv, image=image, image_sha=image_sha, history=history,
                                         expect_turns=expect_turns, index_digest=index_digest,
                                         newest=new_conv and newest, notify=notify, slots=slots)
        except NotYourConversation:
            if not new_conv:
                self.convs.check_owner(user_id, conv)  # cleared, or not the caller's: ConversationCleared says why
            raise
        if admitted.dispatched is not None:  # a slot was free: SUBMIT handed out the next job; send it to Celery
            self.fair.send(*admitted.dispatched, workers=workers)
        return Submitted(job_id, conv, question.image_sha)

    def events(self, job_id: str, last_id: str = "0") -> Iterator[tuple[str, dict]]:
        """Yield ``(stream_id, event)`` from ``last_id`` (replaying everything from "0") until a terminal event.

        While waiting it runs the reaper sweep, so a dead worker or an expired queue slot still ends the
        stream even when no worker is alive to notice (``worker.store.stream_reader.StreamReader.follow``).
        """
        return self.stream_reader.follow(job_id, last_id)

    def cancel(self, user_id: str, job_id: str) -> bool:
        """Cancel the user's job; returns False when it had already ended. Other users' jobs are refused."""
        owner = self.r.hget(self.keys.job(job_id), JobField.user)
        if owner is None or owner.decode() != user_id:
            raise UnknownJob()
        return self.jobs.cancel(job_id)

    def queue_position(self, job_id: str) -> int | None:
        return self.jobs.position(job_id)

    def queue_positions(self, job_ids: list[str]) -> dict[str, int | None]:
        """Many queued jobs' positions in one round trip (None for a job not queued)."""
        return self.jobs.positions(job_ids)

    def eta_s(self, position: int | None) -> float | None:
        """Seconds until a job at ``position`` should start (the one queue ETA; None while unknown)."""
        return self.readouts.eta_s(position)

    def workers_alive(self) -> int:
        """How many workers have a live heartbeat, read at most once a second (every page following a queued
        answer asks at each poll)."""
        return len(self._workers())

    def _workers(self) -> dict:
        """The live workers' heartbeats, read at most once a second while there are some (none: each time, so the
        first worker to come up is used at once): every submit and every waiting tab asks."""
        now = time.monotonic()
        if now - self._alive_read_at >= 1.0 or not self._alive:
            self._alive, self._alive_read_at = heartbeat.alive(self.r, self.keys), now
        return self._alive

    def served_models(self) -> list[str]:
        """The models the live workers serve (their checkpoints' names), read at most once a second."""
        now = time.monotonic()
        if now - self._models_read_at >= 1.0:
            self._models = heartbeat.served_models(heartbeat.alive(self.r, self.keys))
            self._models_read_at = now
        return self._models

    def queue_stats(self) -> dict:
        """Queue aggregates for operators: queued, waiting_clients, oldest_wait_s, in_flight."""
        return self.readouts.queue_stats()

    def identity_key(self) -> bytes:
        """The server-only key that signs anonymous identities when the operator configured none: made once,
        kept in Redis (so every UI replica and restart agrees), never sent to a browser."""
        key = self.keys.identity_key
        self.r.set(key, secrets.token_hex(32), nx=True)
        return self.r.get(key)

    def job_state(self, job_id: str) -> str | None:
        """queued, dispatched, started, done, error, cancelled; None when unknown or expired."""
        state = self.r.hget(self.keys.job(job_id), JobField.state)
        return state.decode() if state is not None else None

    def health(self) -> dict:
        try:
            self.r.ping()
        except redis.RedisError:
            return {"redis": False, "workers": []}
        workers = heartbeat.alive(self.r, self.keys)
        return {"redis": True, "workers": [vars(w) for w in workers.values()],
                "queued": self.readouts.queued_total(), **self.readouts.affinity_stats()}

    def dispatch(self) -> int:
        """Run one dispatch pass now (normally triggered by submits and by workers)."""
        return self.fair.dispatch()

    def close(self, purge: bool = False) -> None:
        """Close the connection; ``purge`` first deletes every key under this client's prefix (tests and
        benchmarks run in a namespace of their own and clean it up this way)."""
        if purge:
            keys = list(self.r.scan_iter(match=self.keys.prefix + "*", count=1000))
            if keys:
                self.r.delete(*keys)
        self.r.close()

def _check_user(user_id) -> None:
    if not isinstance(user_id, str) or not user_id or len(user_id) > 200:
        raise InvalidInput("A user id is required.")


def _check_caller(user_id, group) -> None:
    _check_user(user_id)
    if group is not None:
        _check_user(group)

def wait_for_workers(client: OwletClient, n: int = 1, timeout_s: float = 60.0) -> list[dict]:
    """Block until ``n`` workers have a live heartbeat (scripts and tests); raises TimeoutError."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = client.health()["workers"]
        if len(workers) >= n:
            return workers
        time.sleep(0.1)
    raise TimeoutError(f"fewer than {n} Owlet workers alive after {timeout_s:.0f} s")
