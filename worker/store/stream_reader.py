"""``StreamReader``: how a caller of ``OwletClient`` reads job streams, for one reader or for many at once.

Two readers share it. ``OwletClient.events`` (benchmarks, tests, a lone reader) follows one job with ``follow``.
The page's ``ui.chat.stream_hub.StreamHub`` follows every answer its tabs watch with one ``read`` per tick (one
XREAD for all of them), asks ``places`` for the waiting ones in one call, and ``silent`` for the streams that went
quiet. Both meet the same facts the same way:

- a silent stream is checked (``silent``): the reaper sweep runs first (so a dead worker or an expired queue slot
  still ends the job when no worker is alive to notice), then a stream that vanished ends with
  ``vanished_event()``, and a job that ended without a terminal event in sight is read once more and then over;
- a page's notice stream (``Keys.started_notices``) names its waiting jobs that started, so they are read again.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import redis

from worker.errors import UnknownJob
from worker.store.keys import EntryField, JobField, Keys
from worker.queue.job_states import JobStates
from worker.queue.reaper import Reaper
from worker.redis_retry import UNREACHABLE
from worker.store.streams import TERMINAL, decode

VANISHED, ENDED = "vanished", "ended"  # what ``silent`` finds: the stream is gone, or its job ended

Entries = list[tuple[str, dict]]  # (entry id, decoded event), in order


def vanished_event() -> dict:
    """The terminal event a reader gets for a stream that expired or never existed."""
    return {"type": "error", "message": UnknownJob.user_message, "t": time.time()}


class StreamReader:
    def __init__(self, r: redis.Redis, keys: Keys, jobs: JobStates, reaper: Reaper, block_ms: int,
                 reconnect_s: float):
        self.r, self.keys, self.jobs, self.reaper = r, keys, jobs, reaper
        self.block_ms, self.reconnect_s = block_ms, reconnect_s

    def key(self, job_id: str) -> str:
        return self.keys.stream(job_id)

    # ---- many streams at once (the page) ----------------------------------------------------------------

    def new_notices(self) -> str:
        """A fresh notice stream for one page: SUBMIT's ``notify`` names it, and the job's start is written there."""
        return self.keys.started_notices(uuid.uuid4().hex)

    def keep_notices(self, notices: str, ttl_s: int) -> None:
        """The notice stream outlives its page by at most ``ttl_s`` (its page refreshes it while it runs)."""
        self.r.expire(notices, ttl_s)

    def read(self, positions: dict[str, str], block_ms: int | None = None, count: int = 512,
             notices: tuple[str, str] | None = None) -> tuple[dict[str, Entries], list[tuple[str, str]]]:
        """One XREAD of every stream in ``positions`` (stream key -> last id read), and of the ``notices`` stream
        (key, last id) if given. Returns each stream's new entries, and the notices as (entry id, started job)."""
        streams = dict(positions)
        if notices is not None:
            streams[notices[0]] = notices[1]
        reply = self.r.xread(streams, count=count, block=block_ms)
        read, started = {}, []
        for key, entries in reply or ():
            key = key.decode() if isinstance(key, bytes) else key
            if notices is not None and key == notices[0]:
                started += [(entry_id.decode(), (fields.get(EntryField.data.encode()) or b"").decode())
                            for entry_id, fields in entries]
            else:
                read[key] = [(entry_id.decode(), decode(fields)) for entry_id, fields in entries]
        return read, started

    def places(self, job_ids: list[str]) -> tuple[dict[str, int | None], float | None]:
        """Waiting jobs' places in line in one call, and the seconds each place adds (``JobStates.places``)."""
        return self.jobs.places(job_ids)

    def silent(self, job_ids: list[str]) -> dict[str, str]:
        """For jobs whose streams went quiet: ``VANISHED`` (the stream is gone) or ``ENDED`` (the job's state is
        terminal), by job; a job still running is left out. Runs the reaper sweep first, when it is due."""
        self.reaper.sweep_if_due()  # ends jobs of dead workers and expired queue slots
        with self.r.pipeline(transaction=False) as p:
            for job_id in job_ids:
                p.exists(self.keys.stream(job_id))
                p.hget(self.keys.job(job_id), JobField.state)
            replies = p.execute()
        found = {}
        for i, job_id in enumerate(job_ids):
            stream_exists, state = replies[2 * i], replies[2 * i + 1]
            if not stream_exists:
                found[job_id] = VANISHED
            elif state is not None and state.decode() in TERMINAL:
                found[job_id] = ENDED
        return found

    # ---- one stream (a lone reader) ---------------------------------------------------------------------

    def follow(self, job_id: str, last_id: str = "0") -> Iterator[tuple[str, dict]]:
        """Yield ``(entry id, event)`` of one job from ``last_id`` on until a terminal event (``vanished_event()``,
        under id "0-0", for a stream that expired under the reader). Raises ``UnknownJob`` for a job never heard of.

        An empty wait checks the job (``silent``); a job found ended is read without blocking until nothing more
        comes, since its terminal event may have been written just after the wait returned. While Redis is
        unreachable, reading resumes from the last id once it is back; only an outage longer than ``reconnect_s``
        raises."""
        key = self.keys.stream(job_id)
        if not self.r.exists(key) and not self.r.exists(self.keys.job(job_id)):
            raise UnknownJob()
        down_since, stopping, found = None, False, None
        while True:
            try:
                read, _ = self.read({key: last_id}, count=256, block_ms=None if stopping else self.block_ms)
                if not read and not stopping:
                    found = self.silent([job_id]).get(job_id)
                    stopping = found is not None
                    continue
            except UNREACHABLE:
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since >= self.reconnect_s:
                    raise
                time.sleep(0.5)
                continue
            down_since = None
            if not read:  # stopping, and nothing more was written
                if found == VANISHED:  # the stream expired under the reader: still end with a terminal event
                    yield "0-0", vanished_event()
                return
            for entry_id, event in read[key]:
                last_id = entry_id
                yield entry_id, event
                if event["type"] in TERMINAL:
                    return
