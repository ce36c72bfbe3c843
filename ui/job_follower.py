"""Follow one job's event stream and turn it into what the page shows, without ever hanging.

The worker client's ``events()`` is a blocking generator, so a small daemon thread reads it and hands
events to the asyncio side. The async side waits with a timeout, which lets it refresh the
"queued — position k" line while the job waits and notice a stream that went silent (a lost worker).
Bursts of tokens are coalesced, and updates are sent at most every ``min_interval_s``, so a fast model
does not flood the server (each update re-renders the chat) or the browser.
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ui import wording

_END = object()  # the reader thread finished (terminal event seen, or the stream vanished)


@dataclass
class Progress:
    """A snapshot of one turn, as of the latest event."""
    state: str = "queued"  # queued | running | done | error | cancelled | lost
    answer: str = ""
    status: str = ""  # the "Queued — position k" line, or "" once tokens flow
    position: int | None = None
    eta_s: float | None = None
    stats: dict = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    started_at: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None  # submit → first token, as the user saw it
    queue_wait_s: float | None = None  # submit → a worker started it
    run_s: float | None = None  # a worker started it → its last token (feeds the queue ETA)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "error", "cancelled", "lost")


def _read_into(client, job_id: str, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue,
               gone: threading.Event) -> None:
    """Thread body: relay the job's events until a terminal one, or until the reader has gone away."""

    def hand_over(item) -> bool:
        if gone.is_set():
            return False
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
            return True
        except RuntimeError:  # the event loop closed (server shutting down)
            return False

    try:
        for _entry_id, event in client.events(job_id, last_id="0"):
            if not hand_over(event):
                return
    except Exception as exc:  # Redis down mid-stream: report it, never leave the page waiting
        if gone.is_set():
            return
        hand_over({"type": "error", "message": wording.SERVICE_DOWN, "_exc": repr(exc)})
    hand_over(_END)


def _apply(progress: Progress, event: dict) -> None:
    """Fold one stream event into the snapshot (pure; see docs/interfaces.md for the event shapes)."""
    kind = event.get("type")
    now = time.monotonic() - progress.started_at
    if kind == "queued":
        if event.get("restart"):  # its worker died: the job runs again from scratch, so drop the partial answer
            progress.state, progress.answer, progress.first_token_s, progress.queue_wait_s = "queued", "", None, None
        progress.position, progress.eta_s = event.get("position"), event.get("eta_s")
        progress.status = wording.queued(progress.position, progress.eta_s)
        if event.get("restart"):
            progress.status = wording.RESTARTED + " " + progress.status
    elif kind == "started":
        progress.state, progress.status = "running", ""
        progress.queue_wait_s = now
    elif kind == "token":
        if progress.state == "queued":  # a replayed stream may start with tokens
            progress.state, progress.status = "running", ""
        if progress.first_token_s is None:
            progress.first_token_s = now
        progress.answer += event.get("text") or ""
    elif kind == "done":
        progress.state, progress.status = "done", ""
        progress.run_s = now - (progress.queue_wait_s or 0.0)
        progress.answer = event.get("text", progress.answer) or progress.answer
        progress.stats = event.get("stats") or {}
        progress.finish_reason = event.get("finish_reason")
    elif kind == "error":
        progress.state, progress.status = "error", ""
        progress.error = event.get("message") or wording.ANSWER_FAILED
    elif kind == "cancelled":
        progress.state, progress.status = "cancelled", ""
        progress.finish_reason = "cancelled"


async def follow_job(client, job_id: str, *, poll_s: float, stall_timeout_s: float,
                     started_at: float | None = None, eta=None, min_interval_s: float = 0.0) -> AsyncIterator[Progress]:
    """Yield ``Progress`` snapshots until the job ends; the last one is always ``finished``.

    ``eta(position) -> seconds | None`` estimates the wait when the queue event does not carry one.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    gone = threading.Event()  # set when this reader stops listening, so the thread ends at its next event
    threading.Thread(target=_read_into, args=(client, job_id, loop, queue, gone), daemon=True,
                     name=f"owlet-follow-{job_id[:8]}").start()
    try:
        async for progress in _follow(client, job_id, queue, poll_s, stall_timeout_s, started_at, eta,
                                      min_interval_s):
            yield progress
    finally:
        gone.set()


async def _follow(client, job_id, queue, poll_s, stall_timeout_s, started_at, eta,
                  min_interval_s) -> AsyncIterator[Progress]:
    progress = Progress(started_at=started_at or time.monotonic())
    last_event_at = last_yield_at = time.monotonic()
    unsent = False  # tokens applied but not yet shown, held back by min_interval_s
    while True:
        timeout = poll_s
        if unsent:
            timeout = max(0.0, min_interval_s - (time.monotonic() - last_yield_at))
        try:
            item = await asyncio.wait_for(queue.get(), timeout=timeout)
        except asyncio.TimeoutError:
            if unsent:
                unsent, last_yield_at = False, time.monotonic()
                yield progress
                continue
            silent_for = time.monotonic() - last_event_at
            if progress.state == "queued":
                position = await asyncio.to_thread(_position, client, job_id)
                if position is not None:
                    last_event_at = time.monotonic()  # still waiting its turn: that is not a stall
                    if position != progress.position:
                        progress.eta_s = await asyncio.to_thread(eta, position) if eta else None
                        progress.position = position
                        progress.status = wording.queued(position, progress.eta_s)
                        yield progress
                    continue
            if silent_for > stall_timeout_s:
                progress.state, progress.error = "lost", wording.WORKER_LOST
                yield progress
                return
            continue
        last_event_at = time.monotonic()
        items = [item]
        while not queue.empty():  # coalesce a burst of tokens into one update
            items.append(queue.get_nowait())
        for event in items:
            if isinstance(event, dict) and event.get("type") == "queued" and event.get("eta_s") is None and eta:
                event = {**event, "eta_s": await asyncio.to_thread(eta, event.get("position"))}
            if event is _END:
                if not progress.finished:  # the stream ended or vanished without a terminal event
                    progress.state, progress.error = "lost", wording.WORKER_LOST
                yield progress
                return
            _apply(progress, event)
        if progress.finished:
            yield progress
            return
        # A fast model emits hundreds of tokens a second; re-rendering the chat for each costs the server
        # and the browser far more than it shows. Updates go out at most every min_interval_s.
        if time.monotonic() - last_yield_at >= min_interval_s:
            unsent, last_yield_at = False, time.monotonic()
            yield progress
        else:
            unsent = True


def _position(client, job_id: str) -> int | None:
    try:
        return client.queue_position(job_id)
    except Exception:  # a failed refresh of the queue line is not worth failing the turn
        return None

