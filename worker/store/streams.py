"""Per-job Redis Streams of events: queued, started, token, done, error, cancelled.

Each entry has a ``type`` field and a ``data`` field holding JSON. Readers replay from id 0, so late
or reconnecting readers lose nothing. Terminal events are written by the Lua scripts in
``worker.queue.scripts`` (atomically with the job's state change); this module writes the others and decodes them
(``worker.store.stream_reader`` reads them).
"""
from __future__ import annotations

import json
import logging
import time

import redis

from worker.store.keys import ENDED_STATES, TOKEN_EVENT, EntryField, Keys
from worker.store import stream_batcher
from worker.store.stream_batcher import StreamBatcher
from worker.redis_retry import UNREACHABLE

log = logging.getLogger(__name__)

TERMINAL = frozenset(ENDED_STATES)  # a job's last event is named after the state it ended in


def encode(event_type: str, **data) -> dict:
    data.setdefault("t", time.time())
    return {EntryField.type: event_type, EntryField.data: json.dumps(data)}


def decode(fields: dict) -> dict:
    event = json.loads(fields[EntryField.data.encode()])
    event["type"] = fields[EntryField.type.encode()].decode()
    return event


class StreamWriter:
    """Appends non-terminal events to one job's stream.

    While Redis is unreachable (restarting), events are dropped rather than failing the job: generation goes
    on, and the terminal ``done`` event, written once Redis is back, carries the whole answer.

    With a ``batcher`` (``worker.store.stream_batcher``, one per worker process), the first event goes out at once, on
    the runner's own thread (a hand-off to the batcher's thread could wait out the interpreter's switch interval), and
    the later ones with the other answers' writes, one round trip for all; ``flush`` waits for them, and comes before
    the job's terminal event. An answer's last write goes with its finish (``token_event_data``), and so do its token
    writes still waiting in the batcher when it ends (``take_unsent``).
    """

    RETRY_AFTER_S = stream_batcher.RETRY_AFTER_S  # after a failed write, skip writes this long, as the batcher does
    FLUSH_TIMEOUT_S = 10.0  # the longest a runner waits for its batched writes before ending its job

    def __init__(self, r: redis.Redis, keys: Keys, job_id: str, maxlen: int, batcher: StreamBatcher | None = None):
        self.r, self.key, self.maxlen = r, keys.stream(job_id), maxlen
        self.batcher = batcher
        self._skip_until = 0.0
        self._written = False  # the first event was written (at once)
        self._last = 0  # the batcher's number of this stream's last batched write

    def add(self, event_type: str, **data) -> None:
        assert event_type not in TERMINAL, "terminal events go through the finish script"
        if self.batcher is not None and self._written:
            self._last = self.batcher.add(self.key, encode(event_type, **data), self.maxlen)
            return
        if time.monotonic() < self._skip_until:
            return
        try:
            self.r.xadd(self.key, encode(event_type, **data), maxlen=self.maxlen, approximate=True)
            self._written = True
        except UNREACHABLE as exc:
            log.warning("Redis unreachable; %s events for %s dropped until it is back (%s)", event_type, self.key, exc)
            self._skip_until = time.monotonic() + self.RETRY_AFTER_S

    def take_unsent(self) -> str:
        """At the answer's end, instead of ``flush``: the text of its token writes still waiting in the batcher, taken
        back for its finish to write before its last tokens (no round trip of their own); any already on their way
        are waited for. '' when none waits; when they cannot be taken back (one is not a token event), waits for them
        as ``flush`` does."""
        if self.batcher is None or not self._last:
            return ""
        taken = self.batcher.take_back(self.key, self._last, self.FLUSH_TIMEOUT_S)
        if taken is None:
            self.flush()
            return ""
        return "".join(json.loads(fields[EntryField.data])["text"] for fields in taken)

    def flush(self) -> None:
        """Wait until this stream's batched events were sent (or dropped), so none lands after its terminal event."""
        if self.batcher is not None and self._last:
            if not self.batcher.wait_sent(self._last, self.FLUSH_TIMEOUT_S):
                log.warning("stream writes for %s not sent within %.0f s", self.key, self.FLUSH_TIMEOUT_S)


def token_event_data(text: str) -> str:
    """A token event's data (JSON), for a script to write: an answer's last token write goes with its finish."""
    return encode(TOKEN_EVENT, text=text)[EntryField.data]
