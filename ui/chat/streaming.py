"""Streaming one answer into a tab: queue position, the growing answer, then how it ended.

Every followed job is read by the page's one ``StreamHub`` and paced by the shared ``UpdatePacer``
(``ui.chat.stream_hub``, ``ui.chat.pacing``); ``follow_job`` folds its events into snapshots, and this module turns
each snapshot into the four outputs of an answering event (box, chat, status, tab). Stop, a closed tab or "New
conversation" cancel the job: a closed stream's job after ``RELOAD_GRACE_S``, unless a reloaded page follows it
by then. The time an answer streamed (first token to end; not its wait in the queue) is charged to the caller's
address, which the event-slot picker weighs (ui/gradio_adapters/fair_event_slots.py).
"""
from __future__ import annotations

import asyncio
import time

import gradio as gr

from ui.chat.input_box import EMPTY_BOX, box, box_as_sent
from ui.chat.job_follower import follow_job
from ui.chat.pacing import UpdatePacer, watch_loop_lag
from ui.chat.page_reads import PageReads
from ui.chat.stream_hub import StreamHub
from ui.chat.view import assistant_message
from ui.gradio_adapters.fair_event_slots import SlotUsage
from ui.shared import wording

RELOAD_GRACE_S = 10.0  # how long an answer whose stream closed waits for a reloaded page to follow it again
FIRST_UPDATE_S = 0.05  # the first update of a turn waits this long for the job's first events


class AnswerStreams:
    def __init__(self, client, config, metrics, reads: PageReads):
        self.client, self.config, self.metrics, self.reads = client, config, metrics, reads
        # One reader for all answer streams, and one update budget they share.
        self.hub = StreamHub(client, tick_s=config.stream_read_tick_s,
                             outage_grace_s=client.settings.redis_reconnect_s, place_poll_s=config.queue_poll_s)
        self.pacer = UpdatePacer(config.page_max_updates_per_s, 1.0 / config.stream_min_interval_s,
                                 config.stream_min_updates_per_s)
        self.answer_time = SlotUsage()  # per address, its answers' recent streaming time
        self._lag_watch = None  # the task that lets the pacer follow the event loop's load (started on first use)
        # Jobs stopped by their owner whose streams have not ended yet: those streams leave the box alone, which is
        # the user's again (a question typed after Stop would otherwise be wiped by the answer's last updates).
        self._stopped_jobs: set[str] = set()

    def watch_load(self) -> None:
        if self._lag_watch is None or self._lag_watch.done():
            self._lag_watch = asyncio.get_running_loop().create_task(watch_loop_lag(self.pacer))

    def stopped(self, job: str) -> None:
        """Its owner stopped ``job``: its stream, until it ends, leaves the box and the status line alone."""
        self._stopped_jobs.add(job)

    async def stream(self, caller, tab, job, base, started):
        """Follow ``job`` to its end: queue position, then the growing answer under the chat ``base`` (which ends
        with the question), then the final stats."""
        user = caller.user
        follow_up = len(base) > 1  # earlier turns exist, so a session cache hit is possible
        self.metrics.active_streams.inc()
        finished = locked = lost = False
        answering_since = None
        try:
            async for p in follow_job(self.client, job, hub=self.hub, pacer=self.pacer,
                                      poll_s=self.config.queue_poll_s, stall_timeout_s=self.config.stall_timeout_s,
                                      started_at=started, eta=self.client.eta_s,
                                      workers_alive=self.client.workers_alive, first_update_s=FIRST_UPDATE_S):
                finished, lost = p.finished, p.state == "lost"
                if p.answer and answering_since is None:
                    answering_since = time.monotonic()
                if not p.finished:
                    bubble = p.answer or wording.waiting(p.status or wording.THINKING)
                    shown_now = base + [assistant_message(bubble)]
                    if not locked:  # the first update locks the box and stores the job (Stop cancels it)
                        locked = True
                        yield box(True), shown_now, p.status, tab
                        continue
                    # Once locked, the same plain empty value keeps the box so, and Gradio's diff of it is
                    # empty. (gr.skip() would make Gradio rebuild the component and its config on every
                    # update, the costliest part of an update; only a stopped answer's few last updates pay
                    # it.) The tab state has not changed since: skipping it spares Gradio a state write and a
                    # config rebuild per update.
                    if job in self._stopped_jobs:  # the box and "Stopped." are the user's until the job ends
                        yield gr.skip(), shown_now, gr.skip(), gr.skip()
                    else:
                        yield EMPTY_BOX, shown_now, p.status, gr.skip()
                    continue
                tab = {**tab, "job": None}
                # Locked: open the box with no value, which keeps a draft typed after Stop (the first update
                # cleared the question already). Never locked: only the submitted text needs clearing.
                status = final_status(p, follow_up)
                if not tab.get("has_image") and p.state == "done":
                    status = f"{wording.NO_PICTURE_YET} · {status}"
                shown_box = gr.skip() if job in self._stopped_jobs else box_as_sent() if locked else EMPTY_BOX
                yield shown_box, base + [assistant_message(final_bubble(p))], status, tab
                self._record(p, follow_up)
        finally:
            if answering_since is not None:
                self.answer_time.charge(caller.address, time.monotonic() - answering_since)
            self._stopped_jobs.discard(job)
            self.metrics.active_streams.dec()
            if not finished:  # tab closed (or reloaded), Stop, or the server shutting down: free the engine slot
                self._cancel_unless_followed(user, job)
            elif lost:  # given up on: free its dispatch slot and its conversation, or both stay "answering"
                self.reads.cancel(user, job)

    def _cancel_unless_followed(self, user, job) -> None:
        """Cancel ``job`` after ``RELOAD_GRACE_S`` unless a stream follows it by then (the hub's subscriptions): a
        reload closes the old tab's stream a moment before the new page (or another tab) follows the same answer,
        which it must not find cancelled."""
        loop = asyncio.get_running_loop()

        def cancel_if_unfollowed():
            if not self.hub.following(job):
                self.metrics.cancels.inc()
                self.metrics.turns.labels("cancelled").inc()
                loop.run_in_executor(None, self.reads.cancel, user, job)
        loop.call_later(RELOAD_GRACE_S, cancel_if_unfollowed)

    def _record(self, p, follow_up: bool) -> None:
        m = self.metrics
        m.turns.labels({"done": "done", "cancelled": "cancelled"}.get(p.state, "error")).inc()
        if p.state == "done":
            m.observe_done(p.stats, follow_up)
        elif p.state == "cancelled":
            m.cancels.inc()
        else:
            m.errors.labels("worker_lost" if p.state == "lost" else "generation").inc()
        if p.queue_wait_s is not None:
            m.queue_wait.observe(p.queue_wait_s)
        if p.first_token_s is not None:
            m.ttft.observe(p.first_token_s)


def final_bubble(p) -> str:
    """The answer's last bubble: the stored turn exactly; how it ended goes in the status line."""
    if p.state in ("error", "lost"):
        return (p.answer + "\n\n" if p.answer else "") + wording.warning(p.error)
    if p.state == "cancelled":
        return (p.answer + " " if p.answer else "") + "*(stopped)*"
    return p.answer


def final_status(p, follow_up: bool) -> str:
    if p.state == "done":
        return wording.answered(p.total_s, p.stats, p.first_token_s, follow_up, p.finish_reason)
    if p.state == "cancelled":
        return wording.STOPPED
    return wording.warning(p.error or wording.ANSWER_FAILED)
