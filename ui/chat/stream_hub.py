"""One reader for every answer stream the page follows: one thread, one multi-stream XREAD per tick.

A thread per stream, each blocking on its own XREAD and waking the event loop once per token, costs the
page a Redis round trip and a thread hop per token: at 64 streams of 40 tokens a second that alone is a
third of a core. Here one thread asks Redis for all followed streams at once (``XREAD ... STREAMS k1 k2 …``),
at most once per ``tick_s``, and hands everything it read to the event loop in one call. The tick bounds the
read rate however many streams are live; while streams are quiet the XREAD blocks, so a token still
arrives within one round trip.

A waiting answer costs no read of its stream. Once the last event a stream gave is "queued", the hub stops reading
it and instead asks Redis for the places in line of every waiting answer it follows at once, once every
``place_poll_s`` (POSITION: O(log N) each in the N waiting), and hands each follower a "place" event with its
position and ETA. A job that starts is read again at once: SUBMIT names this hub's notice stream
(``started_key``), where the job's start is announced, and the hub reads that one stream with the live ones. A
waiting answer the notice misses (a tab reloaded onto it, a notice from another page) is read again at the next
place poll, which finds it no longer queued. So a thousand waiting tabs cost one script call a second, not a
thousand stream reads a tick.

The hub reads through the client's ``worker.store.stream_reader.StreamReader``, the one that ``OwletClient.events``
follows a lone job with: while a live stream is silent, the same check notices a stream that vanished or a job
that ended without a terminal event, and runs the reaper sweep (so a dead worker or an expired queue slot still
ends the stream when no worker is alive to notice).

When Redis goes away (a restart), the answers keep being generated and their streams are kept (append-only
file), so the hub does not end them at once: it tells each follower the page is reconnecting and keeps trying
from each stream's last id for ``outage_grace_s``. Once Redis is back, every answer resumes where it stopped and
ends with its own terminal event — the user is never told "try again" while the job is in fact still running.
Only an outage longer than the grace ends the streams with a sentence, so no stream waits forever.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from ui.shared import wording
from worker.store.keys import JobState
from worker.redis_retry import UNREACHABLE
from worker.store.stream_reader import VANISHED, vanished_event
from worker.store.streams import TERMINAL

log = logging.getLogger("owlet.ui")

# deliver(events, ended): events are decoded stream events in order; ended means no more will come.
Deliver = Callable[[list, bool], None]


@dataclass(eq=False)
class Subscription:
    job_id: str
    key: str
    loop: asyncio.AbstractEventLoop
    deliver: Deliver
    last_id: str = "0"  # replay from the start: a late or reconnecting reader loses nothing
    last_event_at: float = field(default_factory=time.monotonic)
    ended: bool = False
    waiting: bool = False  # its last event is "queued": its place is polled instead of its stream read


# How long this hub's notice stream outlives its last refresh (the hub refreshes it every STARTED_REFRESH_S): a page
# that stopped leaves it behind no longer than this.
STARTED_TTL_S = 3600
STARTED_REFRESH_S = 60


class StreamHub:
    def __init__(self, client, *, tick_s: float = 0.02, block_ms: int = 100, idle_check_s: float = 1.0,
                 outage_grace_s: float = 60.0, place_poll_s: float = 1.0):
        assert tick_s >= 0 and 0 < block_ms < 5000, "tick must be >= 0 and block under redis-py's 5 s timeout"
        self.reader = client.stream_reader  # worker.store.stream_reader: reads, place polls and silence checks
        self.tick_s, self.block_ms, self.idle_check_s = tick_s, block_ms, idle_check_s
        self.outage_grace_s, self.place_poll_s = outage_grace_s, place_poll_s
        # Where the jobs this page submits announce their start (SUBMIT's ``notify``): read with the live streams.
        self.started_key = self.reader.new_notices()
        self._started_last_id = "0"
        # By stream key: every follower of that stream (a reloaded page or a second tab follows the same answer
        # as the first; with one subscription per key the newest would take the stream from the others, which
        # would wait for the stall timeout and tell their user the worker was lost).
        self._subs: dict[str, list[Subscription]] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the event loop's side ----------------------------------------------------------------------------
    def subscribe(self, job_id: str, deliver: Deliver) -> Subscription:
        """Follow ``job_id``'s stream from its start; ``deliver`` runs on the calling event loop."""
        sub = Subscription(job_id, self.reader.key(job_id), asyncio.get_running_loop(), deliver)
        with self._lock:
            self._subs.setdefault(sub.key, []).append(sub)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="owlet-stream-hub", daemon=True)
                self._thread.start()
        self._wake.set()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._drop(sub)

    def _drop(self, sub: Subscription) -> None:
        """Forget ``sub`` (the lock held)."""
        followers = self._subs.get(sub.key, [])
        if sub in followers:
            followers.remove(sub)
            if not followers:
                del self._subs[sub.key]

    def following(self, job_id: str) -> int:
        """How many of this page's streams follow ``job_id`` now."""
        with self._lock:
            return len(self._subs.get(self.reader.key(job_id), ()))

    @property
    def live(self) -> int:
        return sum(len(followers) for followers in self._subs.values())

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    # -- the hub thread -----------------------------------------------------------------------------------
    def _run(self) -> None:
        last_idle_check = last_place_poll = last_refresh = time.monotonic()
        down_since = None  # when Redis stopped answering (None: it answers)
        told: set[str] = set()  # streams already told about this outage
        while not self._stop.is_set():
            with self._lock:
                subs = [sub for followers in self._subs.values() for sub in followers]
            if not subs:
                self._wake.wait(1.0)
                self._wake.clear()
                continue
            started = time.monotonic()
            try:
                live = [s for s in subs if not s.waiting]
                self._read(live, block=not self._wake.is_set())
                self._wake.clear()
                if down_since is not None:
                    log.warning("stream hub: Redis is back after %.1f s", started - down_since)
                    down_since, told = None, set()
                if started - last_place_poll >= self.place_poll_s:
                    last_place_poll = started
                    self._poll_places([s for s in subs if s.waiting and not s.ended])
                if started - last_refresh >= STARTED_REFRESH_S:
                    last_refresh = started
                    self.reader.keep_notices(self.started_key, STARTED_TTL_S)
                if started - last_idle_check >= self.idle_check_s:
                    last_idle_check = started
                    self._check_idle(live)
            except UNREACHABLE as exc:  # Redis down or restarting: wait for it a while, then end with a sentence
                if down_since is None:
                    log.warning("stream hub read failed: %r; waiting up to %.0f s for Redis", exc, self.outage_grace_s)
                    down_since = started
                if started - down_since < self.outage_grace_s:
                    fresh = [s for s in subs if s.key not in told]
                    told.update(s.key for s in fresh)
                    self._notify(fresh, {"type": "notice", "message": wording.RECONNECTING})
                else:
                    self._end_all(subs, {"type": "error", "message": wording.SERVICE_DOWN})
                self._stop.wait(0.5)
            except redis.RedisError as exc:  # any other Redis failure: end every stream with a sentence at once
                log.warning("stream hub read failed: %r", exc)
                self._end_all(subs, {"type": "error", "message": wording.SERVICE_DOWN})
                self._stop.wait(0.5)
            except Exception:  # a bug here must not leave every page waiting forever
                log.exception("stream hub failed")
                self._end_all(subs, {"type": "error", "message": wording.SERVICE_DOWN})
            # Coalesce: at most one read per tick, so a burst of tokens crosses to the event loop at once.
            self._stop.wait(max(0.0, self.tick_s - (time.monotonic() - started)))

    def _read(self, subs: list[Subscription], block: bool = True) -> None:
        by_key: dict[str, list[Subscription]] = {}
        for s in subs:
            if not s.ended:
                by_key.setdefault(s.key, []).append(s)
        # Each stream is read from its least advanced follower; each follower is handed what it has not seen. This
        # hub's notice stream comes along, so a waiting answer that starts is read at once.
        streams = {key: min((s.last_id for s in followers), key=_id_order) for key, followers in by_key.items()}
        read, started = self.reader.read(streams, block_ms=self.block_ms if block else None,
                                         notices=(self.started_key, self._started_last_id))
        if started:
            self._started(started)
        now = time.monotonic()
        batches: list[tuple[Subscription, list, bool]] = []
        for key, entries in read.items():
            for sub in by_key.get(key, []):
                events = []
                for entry_id, event in entries:
                    if _id_order(entry_id) <= _id_order(sub.last_id):
                        continue
                    sub.last_id = entry_id
                    events.append(event)
                    if event["type"] in TERMINAL:
                        sub.ended = True
                        break
                if events:
                    sub.last_event_at = now
                    sub.waiting = events[-1]["type"] == JobState.queued and not sub.ended
                    batches.append((sub, events, sub.ended))
        self._hand_over(batches)

    def _started(self, notices: list[tuple[str, str]]) -> None:
        """Jobs that announced their start on this hub's notice stream: their followers are read again."""
        self._started_last_id = notices[-1][0]
        jobs = {job_id for _, job_id in notices}
        with self._lock:
            for followers in self._subs.values():
                for sub in followers:
                    if sub.waiting and sub.job_id in jobs:
                        sub.waiting = False

    def _poll_places(self, waiting: list[Subscription]) -> None:
        """Every waiting answer's place in line in one call; a follower gets a "place" event, and an answer no
        longer queued (started, or ended meanwhile) is read again."""
        if not waiting:
            return
        jobs = sorted({s.job_id for s in waiting})
        places, per_position = self.reader.places(jobs)
        now, batches = time.time(), []
        for sub in waiting:
            position = places.get(sub.job_id)
            if position is None:
                sub.waiting = False
                self._wake.set()  # read it at once, without blocking for the others
                continue
            eta = round(position * per_position, 1) if per_position is not None else None
            batches.append((sub, [{"type": "place", "position": position, "eta_s": eta, "t": now}], False))
        self._hand_over(batches)

    def _check_idle(self, subs: list[Subscription]) -> None:
        """Streams silent for a while: vanished, or ended without a terminal event? Also sweep dead workers."""
        now = time.monotonic()
        idle = [s for s in subs if not s.ended and now - s.last_event_at >= self.idle_check_s]
        if not idle:
            return
        found = self.reader.silent(sorted({s.job_id for s in idle}))  # runs the reaper sweep too
        batches, finished = [], []
        for s in idle:
            if found.get(s.job_id) == VANISHED:
                s.ended = True
                batches.append((s, [vanished_event()], True))
            elif s.job_id in found:  # ended
                finished.append(s)
        self._hand_over(batches)
        if finished:
            # The job ended: read once more, since its terminal event may have landed after the last read.
            self._read(finished, block=False)
            # Still none (a reader resuming after it was trimmed): nothing more will come. The follower
            # reports a stream that ends without a terminal event as lost.
            for s in finished:
                if not s.ended:
                    s.ended = True
                    self._hand_over([(s, [], True)])

    def _notify(self, subs: list[Subscription], event: dict) -> None:
        """A non-terminal event for each live subscription (the stream goes on)."""
        self._hand_over([(s, [dict(event, t=time.time())], False) for s in subs if not s.ended])

    def _end_all(self, subs: list[Subscription], event: dict) -> None:
        batches = []
        for s in subs:
            if not s.ended:
                s.ended = True
                batches.append((s, [dict(event, t=time.time())], True))
        self._hand_over(batches)

    def _hand_over(self, batches: list[tuple[Subscription, list, bool]]) -> None:
        """One hop per event loop for everything read this tick; ended subscriptions are dropped."""
        if not batches:
            return
        with self._lock:
            for sub, _events, ended in batches:
                if ended:
                    self._drop(sub)
        by_loop: dict[asyncio.AbstractEventLoop, list] = {}
        for sub, events, ended in batches:
            by_loop.setdefault(sub.loop, []).append((sub.deliver, events, ended))
        for loop, items in by_loop.items():
            try:
                loop.call_soon_threadsafe(_deliver_all, items)
            except RuntimeError:  # that event loop closed (server shutting down)
                pass


def _id_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id ("<ms>-<seq>", or "0" for the start) as a sortable pair."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _deliver_all(items: list) -> None:
    for deliver, events, ended in items:
        try:
            deliver(events, ended)
        except Exception:
            log.exception("delivering stream events failed")
