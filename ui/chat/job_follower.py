"""Follow one job's event stream and turn it into what the page shows, without ever hanging.

The page's ``StreamHub`` reads every followed stream in one thread and hands each tick's events over in one
batch; this async side folds them into a ``Progress`` and decides when the page is updated. While the job waits,
the hub hands it a "place" event every poll (its position and ETA), which refreshes the "You are 3rd in line"
line; it waits with a timeout, which lets it notice a stream that went silent (a lost worker). Tokens are
coalesced: a stream updates the page at most once per the ``UpdatePacer``'s interval (a fair share of the page's
update budget), and its final update is always sent.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ui.shared import wording



@dataclass
class Progress:
    """A snapshot of one turn, as of the latest event."""
    state: str = "queued"  # queued | running | done | error | cancelled | lost
    answer: str = ""
    status: str = ""  # the "You are 3rd in line" line, or "" once tokens flow
    position: int | None = None
    eta_s: float | None = None
    no_worker: bool = False  # queued while no worker is alive: no ETA means anything then
    restarted: bool = False  # queued again after its worker was lost (the line says so)
    stats: dict = field(default_factory=dict)
    finish_reason: str | None = None
    error: str | None = None
    error_kind: str | None = None  # the worker's kind of error (worker.serving.runner): "invalid" = a refused question
    started_at: float = field(default_factory=time.monotonic)
    first_token_s: float | None = None  # submit → first token, as the user saw it
    queue_wait_s: float | None = None  # submit → a worker started it
    run_s: float | None = None  # a worker started it → its last token (feeds the queue ETA)
    total_s: float | None = None  # submit → the answer complete, as the user saw it

    @property
    def finished(self) -> bool:
        return self.state in ("done", "error", "cancelled", "lost")


class _Inbox:
    """Events the hub delivered and this follower has not folded in yet (event-loop side only)."""

    def __init__(self):
        self.events: list = []
        self.ended = False
        self.wake = asyncio.Event()

    def deliver(self, events: list, ended: bool) -> None:
        self.events.extend(events)
        self.ended = self.ended or ended
        self.wake.set()

    def take(self) -> tuple[list, bool]:
        events, self.events = self.events, []
        self.wake.clear()
        return events, self.ended


def _queued_line(progress: Progress) -> str:
    """The line a waiting job shows: its place in the queue, and that it was queued again, if so."""
    line = wording.queued(progress.position, progress.eta_s, no_worker=progress.no_worker)
    return f"{wording.RESTARTED} {line}" if progress.restarted else line


def _apply(progress: Progress, event: dict) -> None:
    """Fold one stream event into the snapshot (pure; see docs/interfaces.md for the event shapes)."""
    kind = event.get("type")
    now = time.monotonic() - progress.started_at
    if kind == "queued":
        if event.get("restart"):  # its worker died: the job runs again from scratch, so drop the partial answer
            progress.state, progress.answer, progress.first_token_s, progress.queue_wait_s = "queued", "", None, None
        progress.position, progress.eta_s = event.get("position"), event.get("eta_s")
        progress.restarted = progress.restarted or bool(event.get("restart"))
        progress.status = _queued_line(progress)
    elif kind == "place":  # the hub's reading of its place in line while it waits (not a stream event)
        if progress.state == "queued":
            progress.position, progress.eta_s = event.get("position"), event.get("eta_s")
            progress.no_worker = bool(event.get("no_worker"))
            if progress.no_worker:
                progress.eta_s = None
            progress.status = _queued_line(progress)
    elif kind == "started":
        progress.state, progress.status = "running", ""
        progress.queue_wait_s = now
    elif kind == "notice":  # e.g. the page is reconnecting to Redis: shown until the stream moves on
        progress.status = event.get("message") or ""
    elif kind == "token":
        if progress.state == "queued":  # a replayed stream may start with tokens
            progress.state, progress.status = "running", ""
        elif progress.status == wording.RECONNECTING:
            progress.status = ""
        if progress.first_token_s is None:
            progress.first_token_s = now
        progress.answer += event.get("text") or ""
    elif kind == "done":
        progress.state, progress.status = "done", ""
        progress.run_s = now - (progress.queue_wait_s or 0.0)
        progress.total_s = now
        progress.answer = event.get("text", progress.answer) or progress.answer
        progress.stats = event.get("stats") or {}
        progress.finish_reason = event.get("finish_reason")
    elif kind == "error":
        progress.state, progress.status = "error", ""
        progress.error = event.get("message") or wording.ANSWER_FAILED
        progress.error_kind = event.get("kind")
    elif kind == "cancelled":
        progress.state, progress.status = "cancelled", ""
        progress.finish_reason = "cancelled"


async def follow_job(client, job_id: str, *, hub, pacer, poll_s: float, stall_timeout_s: float,
                     started_at: float | None = None, eta=None, workers_alive=None,
                     first_update_s: float = 0.0) -> AsyncIterator[Progress]:
    """Yield ``Progress`` snapshots until the job ends; the last one is always ``finished``.

    ``eta(position) -> seconds | None`` estimates the wait when the queue event does not carry one;
    ``workers_alive() -> int``, while the job waits, says whether any worker could start it (with none, the
    line says so instead of an ETA). The first snapshot comes once events arrived and ``first_update_s`` passed
    (sooner only if the job ends).
    """
    inbox = _Inbox()
    subscription = hub.subscribe(job_id, inbox.deliver)
    pacer.join()
    try:
        async for progress in _follow(client, job_id, inbox, pacer, poll_s, stall_timeout_s, started_at, eta,
                                      workers_alive, first_update_s):
            yield progress
    finally:
        pacer.leave()
        hub.unsubscribe(subscription)


async def _follow(client, job_id, inbox: _Inbox, pacer, poll_s, stall_timeout_s, started_at,
                  eta, workers_alive, first_update_s) -> AsyncIterator[Progress]:
    progress = Progress(started_at=started_at or time.monotonic())
    last_event_at = time.monotonic()
    last_yield_at = last_event_at - max(0.0, pacer.interval_s() - first_update_s)  # as if one was just sent
    unsent = False  # tokens applied but not yet shown, held back by the pacer
    while True:
        if not inbox.wake.is_set():
            timeout = poll_s
            if unsent:
                timeout = max(0.0, pacer.interval_s() - (time.monotonic() - last_yield_at))
            try:
                await asyncio.wait_for(inbox.wake.wait(), timeout=timeout)
            except asyncio.TimeoutError:
                if unsent:
                    unsent, last_yield_at = False, time.monotonic()
                    yield progress
                    continue
                if time.monotonic() - last_event_at > stall_timeout_s:
                    progress.state, progress.error = "lost", wording.WORKER_LOST
                    yield progress
                    return
                continue
        events, ended = inbox.take()
        last_event_at = time.monotonic()
        shown = (progress.state, progress.status)
        for event in events:
            if event.get("type") == "queued" and event.get("eta_s") is None and eta:
                event = {**event, "eta_s": await asyncio.to_thread(eta, event.get("position"))}
            elif event.get("type") == "place" and workers_alive is not None:
                event = {**event, "no_worker": not await asyncio.to_thread(workers_alive)}
            _apply(progress, event)
            if progress.finished:
                break
        if events and all(e.get("type") == "place" for e in events) and (progress.state, progress.status) == shown:
            continue  # still waiting, and the line reads the same: nothing to show
        if ended and not progress.finished:  # the stream ended or vanished without a terminal event
            progress.state, progress.error = "lost", wording.WORKER_LOST
        if progress.finished:
            yield progress
            return
        # A fast model emits hundreds of tokens a second; re-rendering the chat for each costs the page and
        # the browser far more than it shows. Updates go out at most once per the pacer's interval.
        if time.monotonic() - last_yield_at >= pacer.interval_s():
            unsent, last_yield_at = False, time.monotonic()
            yield progress
        else:
            unsent = True

