"""The page's event handlers: thin, each one a few calls into the worker client and ``job_follower``.

Handlers never raise to Gradio: every failure becomes a chat message or a status line, so the user sees a sentence,
never a traceback or a spinner that never ends. The ``tab`` state (a ``gr.State``, one per browser tab) holds the
conversation id, the job being answered (so Stop can cancel it) and this tab's uploaded image files.
"""
import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping

import gradio as gr

from ui.chat import wording
from ui.chat.job_follower import follow_job
from ui.chat.live_streams import LiveStreams
from ui.chat.pacing import UpdatePacer, watch_loop_lag
from ui.chat.stream_hub import StreamHub
from ui.chat.turn_errors import TurnErrors
from ui.chat.view import (REFUSED, assistant_message, message_text, message_turns, parse_input, refusal,
                          render_history, then_asked, user_message)
from ui.edge.address_slots import AddressSlots, SlotRefused
from ui.edge.refusal_brake import BRAKE_DELAY_S, RefusalLedger, braked_sentence
from ui.gradio_adapters.fair_event_slots import SlotUsage
from ui.gradio_adapters.internals import event_data
from ui.identity import ClientAddresses, IdentityRequired, identify, issuer_for
from ui.uploads.image_check import DecodePool, UploadLimits, UploadRejected
from ui.uploads.owners import UploadedPaths
from ui.uploads.restored_pictures import write_back
from ui.uploads.room import UploadRoom
from worker.errors import ConversationCleared, UnknownJob

log = logging.getLogger("owlet.ui")

TOO_MANY_EVENTS = ("Too many answers are open from your network at once. Wait for one to finish (or stop it), "
                   "then ask again.")

EMPTY_BOX = {"text": "", "files": []}  # the box's value in wire format (answer events skip post-processing)
RELOAD_GRACE_S = 10.0  # how long an answer whose stream closed waits for a reloaded page to follow it again
RESUME_SLOT_WAIT_S = 20.0  # how long a reloaded page waits for its address's event slot to follow its answer
FIRST_UPDATE_S = 0.05  # the first update of a turn waits this long for the job's first events
REFUSALS_KEPT = 8  # refused questions a tab keeps showing with their reasons (ui.chat.view.refusal)


def new_tab_state() -> dict:
    return {"conversation": None, "job": None, "images": {}, "has_image": False, "refusals": []}


def _with_refusal(tab: dict, after: int, question: dict, reason: str) -> dict:
    """``tab`` keeping one more refused question in its chat (the oldest give way past ``REFUSALS_KEPT``)."""
    kept = list(tab.get("refusals") or [])[-(REFUSALS_KEPT - 1):]
    return {**tab, "refusals": [*kept, refusal(after, question, reason)]}


def _in_use(tab) -> bool:
    """Whether a tab has an owner, a chat or an answer: only a fresh one may be (re)loaded."""
    return isinstance(tab, dict) and any(tab.get(key) for key in ("user", "conversation", "job"))


def _belongs_to_another(tab, user) -> bool:
    """Whether a tab is another identity's: a client can name any session hash, and then must not act
    on or learn about the chat behind it."""
    owner = tab.get("user") if isinstance(tab, dict) else None  # None: a tab nobody has used yet
    return owner not in (None, user)


def _box(busy: bool, text: str = ""):
    """The input box: locked with a Stop button while answering, open with Send otherwise.

    An update, never a new component: a component made inside an event joins that tab's Gradio config under
    a new id (that is how ``gr.render`` works) and stays there, with its value, for the tab's life, so every
    answer grew the page's memory by a box (by a 900 KB question, when the box gave a refused question back)."""
    if busy:
        return gr.update(value=EMPTY_BOX, interactive=False, submit_btn=False, stop_btn=True)
    return gr.update(value={"text": text, "files": []}, interactive=True, submit_btn=True, stop_btn=False)


def _box_as_sent():
    """The input box opened again with whatever it holds: a refused question keeps its text and its picture, and
    a retry or edit refused leaves a draft the user is typing alone. (The page does not clear the box on send;
    the first update of an admitted turn does.)"""
    return gr.update(interactive=True, submit_btn=True, stop_btn=False)


class ChatHandlers:
    def __init__(self, client, config, metrics, uploads: UploadedPaths | None = None,
                 upload_room: UploadRoom | None = None):
        self.client, self.config, self.metrics = client, config, metrics
        self.uploads = uploads if uploads is not None else UploadedPaths()  # who uploaded each file (the page's)
        self.upload_room = upload_room  # an admitted turn's picture is marked used: it gives way last
        self.limits = UploadLimits.from_config(config)
        self.issuer = issuer_for(config, client, log)
        self.addresses = ClientAddresses.from_config(config)
        # Reloaded pages wait for a slot (resume); as many may wait as may hold one, so one client cannot park
        # a crowd of waiting events on the page.
        self.event_slots = AddressSlots(config.address_max_events, TOO_MANY_EVENTS,
                                        max_waiting=config.address_max_events)
        self.decoder = DecodePool(config.decode_workers, config.address_max_decodes)
        # Refusals per address; past a count, its turns are refused after a delay (ui.edge.refusal_brake). Shared
        # with the edge's brake, which counts the page's 429s and 503s.
        self.refusals = RefusalLedger(config.address_refusals, config.address_refusals_window_s,
                                      counted=metrics.refusals)
        self.turn_errors = TurnErrors(metrics, self.refusals)
        # Per address, its answers' recent streaming time (ui.gradio_adapters.fair_event_slots weighs it).
        self.answer_time = SlotUsage()
        # One reader for all answer streams, and one update budget they share (ui.chat.stream_hub, ui.chat.pacing).
        self.hub = StreamHub(client, tick_s=config.stream_read_tick_s,
                             outage_grace_s=client.settings.redis_reconnect_s, place_poll_s=config.queue_poll_s)
        self.pacer = UpdatePacer(config.page_max_updates_per_s, 1.0 / config.stream_min_interval_s,
                                 config.stream_min_updates_per_s)
        self._lag_watch = None  # the task that lets the pacer follow the event loop's load (started on first use)
        self.live = LiveStreams()  # whose answer streams in which tab ("New conversation" ends only one's own)
        # Jobs stopped by their owner whose streams have not ended yet: those streams no longer touch the box, which
        # is the user's again (a question typed after Stop was wiped by the stopped answer's last updates).
        self._stopped_jobs: set[str] = set()

    def _watch_load(self) -> None:
        if self._lag_watch is None or self._lag_watch.done():
            self._lag_watch = asyncio.get_running_loop().create_task(watch_loop_lag(self.pacer))

    def _caller(self, request, browser_id):
        """Who is asking and from where; raises IdentityRequired for an anonymous call without a valid token."""
        return identify(request, browser_id, self.issuer, self.addresses)

    async def _guarded(self, request, browser_id, tab, turn, slot_wait_s: float = 0.0):
        """Run one answering event for its caller while that caller's address holds a free event slot.

        ``turn(caller)`` is the event's async generator. A caller without identity, or an address already
        holding ``address_max_events`` answers (after waiting up to ``slot_wait_s`` for one), gets a sentence
        instead of a Gradio thread; an address braked after too many refusals (``ui.edge.refusal_brake``) gets its
        sentence after a delay, holding its slot meanwhile.
        """
        caller = None
        try:
            caller = self._caller(request, browser_id)
            if _belongs_to_another(tab, caller.user):
                yield _box_as_sent(), gr.skip(), wording.NOT_YOUR_SESSION, gr.skip()
                return
            await self.event_slots.acquire_within(caller.address, slot_wait_s, poll_s=0.25)
            try:
                braked_s = self.refusals.braked_for(caller.address)
                if braked_s is not None:  # asked again and again after refusals: slowed, holding its slot
                    self.refusals.braked()
                    await asyncio.sleep(BRAKE_DELAY_S)
                    yield _box_as_sent(), gr.skip(), braked_sentence(braked_s), gr.skip()
                    return
                session_hash = getattr(request, "session_hash", None)
                live = self.live.start(session_hash, caller.user)
                try:
                    # Closed at once on Stop, disconnect or "New conversation": the turn's job is then cancelled.
                    async with contextlib.aclosing(turn(caller)) as updates:
                        async for update in updates:
                            if live.abandoned:
                                # The page shows a fresh chat now. End with an update that changes nothing:
                                # when a stream ends after the fresh chat was shown, Gradio's page re-applies
                                # the stream's last update, which brought the old chat back, box locked.
                                yield gr.skip(), gr.skip(), gr.skip(), gr.skip()
                                break
                            yield update
                finally:
                    self.live.end(session_hash, live)
            finally:
                self.event_slots.release(caller.address)
        except (IdentityRequired, SlotRefused) as exc:
            tab = dict(tab or new_tab_state())
            # The page shows a sent question at once (ui.page_script.show_sent_question); one refused before it
            # was looked at goes back out of the chat and stays in the box, with the reason in the status line.
            chat = gr.skip() if caller is None else (await asyncio.to_thread(self._shown, caller.user, tab))[0]
            yield _box_as_sent(), chat, self._error_text(exc, self.addresses.of(request)), tab

    def _sampling(self, max_new_tokens) -> dict:
        """Generation settings for one turn; the requested length is clamped to the configured cap."""
        try:
            n = int(max_new_tokens)
        except (TypeError, ValueError):
            n = self.config.max_new_tokens
        n = max(1, min(n, self.config.max_new_tokens_cap))
        return {"max_new_tokens": n, "temperature": self.config.temperature}

    # ---- page load and identity -------------------------------------------------------------------

    def on_load(self, stored_browser_id, stored_conversation, tab, request: gr.Request):
        """Give this browser a lasting id (kept in localStorage) and reopen its last conversation, if any.

        The conversation is reopened only if this user still owns it and it has not expired; otherwise the page
        starts with an empty chat (saying so when it gave way to the service's history budget). A new conversation
        whose first answer is still being made is newer than the one the browser remembers (it learns the id when
        that answer ends): that one is reopened, and the browser told to remember it. The page loads once per tab:
        a load under a session hash that is already in use (a client can name any hash, and this event answers on
        the API routes too) changes nothing, so nobody can swap their identity or conversation into another tab.
        """
        session_hash = getattr(request, "session_hash", None)
        if _in_use(tab) or self.live.owner(session_hash) is not None:
            return gr.skip(), gr.skip(), wording.NOT_YOUR_SESSION, gr.skip(), gr.skip()
        browser_id = self.issuer.ensure(stored_browser_id)
        tab = new_tab_state()
        try:
            caller = self._caller(request, browser_id)
            user = caller.user
        except IdentityRequired:  # cannot happen with a token just ensured; the chat then stays unowned
            caller = user = None
        if user is not None:
            tab["user"] = user  # this tab is now the user's: a later load under its hash changes nothing
        if isinstance(stored_conversation, dict):
            stored_conversation = stored_conversation.get("conversation")
        # The browser learns a new conversation's id only when its first answer ends: a reload before then
        # finds it on the server instead (it is newer than anything the browser remembers).
        reopened = self._first_answer(user)
        conversation = reopened or stored_conversation
        if user is not None and isinstance(conversation, str) and conversation:
            try:
                turns = self.client.history(user, conversation)
            except ConversationCleared as exc:  # it gave way to newer ones: say so, and forget it
                return browser_id, [], exc.user_message, tab, {"conversation": None}
            except Exception:  # expired, not this user's, or Redis unavailable: start afresh
                turns = []
            if turns:
                tab["conversation"] = conversation
                tab["has_image"] = any(turn.get("image_sha") for turn in turns)
                tab["job"] = self._pending_job(user, conversation)  # resume() streams it
                tab["images"] = self._pictures_back(caller, conversation) if tab["has_image"] else {}
                return (browser_id, render_history(turns, tab["images"]),
                        wording.RESTORED_ANSWERING if tab["job"] else wording.RESTORED, tab,
                        {"conversation": conversation} if reopened else gr.skip())
        return browser_id, [], "", tab, gr.skip()

    async def resume(self, tab, browser_id, request: gr.Request):
        """After a reload: keep streaming the restored conversation's answer still in progress (``on_load`` put
        its job in the tab), as the tab that asked would have. A question asked, then the page reloaded,
        used to show no answer until the next reload."""
        job = tab.get("job") if isinstance(tab, dict) else None
        if not job:
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        # The reloaded tab's own stream may hold its address's slot until Gradio notices it closed (seconds):
        # wait for it rather than refuse a page that asked nothing new (four people behind one address, one
        # reloads, and was told "Too many answers are open" while its answer was on its way).
        async for update in self._guarded(request, browser_id, tab, lambda caller: self._resume(
                tab, caller, job), slot_wait_s=RESUME_SLOT_WAIT_S):
            yield update

    async def _resume(self, tab, caller, job):
        tab = dict(tab)
        started = time.monotonic()
        base, _stored = await asyncio.to_thread(self._shown, caller.user, tab)
        async for update in self._stream(caller, tab, job, base, started):
            yield update

    def identity(self, stored_token, request: gr.Request):
        """The /identity endpoint: the caller's token if it verifies, else a fresh one. Browsers get theirs
        on page load; API clients call this once and pass the token as ``browser_id`` on every call."""
        return self.issuer.ensure(stored_token)

    def remember_conversation(self, tab, browser_id, request: gr.Request):
        """What the browser keeps so a reload reopens this chat. Always a (truthy) dict: BrowserState skips
        saving falsy values, so a bare None after "New conversation" would leave the old id in place. Only for
        the chat's owner: a client naming another tab's session hash learns nothing (gr.skip keeps its own)."""
        tab = tab or {}
        try:
            user = self._caller(request, browser_id).user
        except IdentityRequired:
            return gr.skip()
        if _belongs_to_another(tab, user):
            return gr.skip()
        return {"conversation": tab.get("conversation")}

    # ---- a new question ---------------------------------------------------------------------------

    async def respond(self, message, max_new_tokens, tab, browser_id, request: gr.Request):
        """Check the input, submit the turn, then stream queue position, tokens and final stats."""
        async for update in self._guarded(request, browser_id, tab, lambda caller: self._respond(
                message, max_new_tokens, tab, caller)):
            yield update

    async def _respond(self, message, max_new_tokens, tab, caller):
        tab = dict(tab or new_tab_state())
        text, files = parse_input(message)
        if not text and not files:
            yield _box_as_sent(), gr.skip(), wording.EMPTY_MESSAGE, tab
            return
        if len(files) > 1:
            yield _box_as_sent(), gr.skip(), wording.ONE_IMAGE_ONLY, tab
            return
        if len(text) > self.config.max_text_chars:
            yield _box_as_sent(), gr.skip(), wording.too_long(self.config.max_text_chars), tab
            return
        checked = None
        if files:
            try:
                checked = await self.decoder.check(files[0], self.limits, caller.address)
            except SlotRefused as exc:
                shown, _stored = await asyncio.to_thread(self._shown, caller.user, tab)
                yield _box_as_sent(), shown, self._error_text(exc, caller.address), tab
                return
            except UploadRejected as exc:
                self.metrics.errors.labels(exc.metric_kind).inc()
                self.metrics.turns.labels("rejected").inc()
                note = exc.user_message  # what is wrong and what to do: "This picture is too large: ..."
                shown, stored = await asyncio.to_thread(self._shown, caller.user, tab)
                question, reason = user_message(text or wording.DEFAULT_IMAGE_PROMPT), wording.warning(note)
                tab = _with_refusal(tab, stored, question, reason)
                yield _box(False, text), then_asked(shown, question) + [assistant_message(reason)], note, tab
                return
        # A new picture starts a new conversation (once admitted: a refused turn leaves the chat as it was). The
        # model would otherwise see both pictures and answer about either (the bundled model mixed them).
        async for update in self._submit_and_stream(caller, tab, text or wording.DEFAULT_IMAGE_PROMPT,
                                                    checked, files[0] if files else None, None,
                                                    sampling=self._sampling(max_new_tokens),
                                                    new_conversation=bool(checked and tab.get("conversation"))):
            yield update

    # ---- retry and edit: truncate the stored history, then ask again --------------------------------

    # The event data is read as plain ``gr.EventData``, not ``gr.RetryData``/``gr.EditData``: those parse it
    # inside Gradio, so an API call without it (or with a malformed one) failed there with Gradio's generic
    # error before this code ran. Here it gets a sentence saying what to send.

    async def retry(self, max_new_tokens, tab, browser_id, data: gr.EventData, request: gr.Request):
        """Ask the retried question again: history is cut back to just before it."""
        index, _ = _chat_event(data)
        async for update in self._guarded(request, browser_id, tab, lambda caller: self._redo(
                max_new_tokens, tab, caller, index, None)):
            yield update

    async def edit(self, max_new_tokens, tab, browser_id, data: gr.EventData, request: gr.Request):
        """Replace an earlier question with its edited text and answer from there."""
        index, value = _chat_event(data)

        def redo(caller):  # the value is read inside the guard: its identity and slot checks come first
            new_text = None if value is _MISSING else message_text(value)
            return self._redo(max_new_tokens, tab, caller, index if new_text is not None else None, new_text)
        async for update in self._guarded(request, browser_id, tab, redo):
            yield update

    async def _redo(self, max_new_tokens, tab, caller, index: int | None, new_text):
        tab = dict(tab or new_tab_state())
        if index is None:
            yield _box_as_sent(), gr.skip(), wording.NEEDS_MESSAGE_INDEX, tab
            return
        conv = tab.get("conversation")
        user = caller.user
        if not conv:
            yield _box_as_sent(), gr.skip(), wording.NOTHING_TO_RETRY, tab
            return
        if new_text is not None and len(new_text) > self.config.max_text_chars:  # the same limit as /chat
            yield _box_as_sent(), gr.skip(), wording.too_long(self.config.max_text_chars), tab
            return
        try:
            await asyncio.to_thread(self._cancel_quietly, user, tab.get("job"))
            turns = await asyncio.to_thread(self.client.history, user, conv)
            refusals = tab.get("refusals") or []
            shown_turns = message_turns(turns, refusals)  # the chat's message index, as a stored turn's index
            if index >= len(shown_turns) or (index >= 0 and shown_turns[index] == REFUSED):
                # A refused question this tab shows with its reason, never stored.
                yield _box_as_sent(), gr.skip(), wording.NEVER_SENT, tab
                return
            index = shown_turns[index] if 0 <= index < len(shown_turns) else None
            if index is None or turns[index].get("role") != "user":
                yield (_box_as_sent(), render_history(turns, tab["images"], refusals),
                       wording.NOT_YOUR_MESSAGE, tab)
                return
            turn = turns[index]
            await asyncio.to_thread(self.client.truncate, user, conv, index)
            # What was refused after the question asked again goes with the turns after it.
            tab["refusals"] = [item for item in refusals if item["after"] <= index]
        except Exception as exc:
            yield _box_as_sent(), gr.skip(), self._error_text(exc, caller.address), tab
            return
        text = new_text if new_text is not None else (turn.get("text") or "")
        text = text.strip() or wording.DEFAULT_IMAGE_PROMPT
        shown = render_history(turns[:index], tab["images"], tab["refusals"])
        async for update in self._submit_and_stream(caller, tab, text, None, None, (shown, index),
                                                    sampling=self._sampling(max_new_tokens),
                                                    image_sha=turn.get("image_sha")):
            yield update

    # ---- the shared submit + stream loop -------------------------------------------------------------

    async def _submit_and_stream(self, caller, tab, text, checked, image_path, shown, sampling, image_sha=None,
                                 new_conversation: bool = False):
        """Submit the turn, then stream it. ``shown``: the chat before this turn and how many stored turns it shows
        (None: read them here). A turn the service refuses stays in the chat with the reason under it.

        A short turn costs the page little: one thread hop reads the history and submits; the box is locked
        with the first update, which waits for the job's first events (at most ``FIRST_UPDATE_S``), so an
        answer that is done by then is sent once, complete, with no lock and unlock.
        """
        started = time.monotonic()
        self._watch_load()
        user = caller.user
        pending_user = user_message(text, image_path or tab["images"].get(image_sha), has_image=bool(
            checked or image_sha))
        (shown, stored), job, image_sha, error = await asyncio.to_thread(
            self._submit, caller, tab, text, checked, image_sha, sampling, shown, new_conversation)
        if error is not None:
            note = self._error_text(error, caller.address)
            question, reason = user_message(text), wording.warning(note)
            tab = _with_refusal(tab, stored, question, reason)
            yield _box_as_sent(), then_asked(shown, question) + [assistant_message(reason)], note, tab
            return
        if new_conversation:  # admitted as the first turn of a new conversation: nothing earlier is shown
            shown = []
            tab.update(images={}, has_image=False, refusals=[])
        if checked is not None:
            tab["images"] = {**tab["images"], image_sha: image_path}
            if self.upload_room is not None:
                self.upload_room.mark_used(image_path, caller.address)
        if image_sha:
            tab["has_image"] = True
        tab["job"] = job
        # The stored history is what was shown plus this turn (appended atomically by the submit): no need to
        # read it back. Earlier messages are built once per turn and shared by every update of the stream.
        async for update in self._stream(caller, tab, job, then_asked(shown, pending_user), started):
            yield update

    async def _stream(self, caller, tab, job, base, started):
        """Follow ``job`` to its end: queue position, then the growing answer under the chat ``base`` (which ends
        with the question), then the final stats. Stop, a closed tab or "New conversation" cancel the job. The
        time the answer streamed (first token to end; not its wait in the queue) is charged to the caller's
        address, which the event-slot picker weighs (ui/gradio_adapters/fair_event_slots.py)."""
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
                        yield _box(True), shown_now, p.status, tab
                        continue
                    # Once locked, the same plain empty value keeps the box so, and Gradio's diff of it is
                    # empty. (gr.skip() would make Gradio rebuild the component and its config on every
                    # update: the costliest part of an update before; only a stopped answer's few last
                    # updates pay it.) The tab state has not changed since: skipping it spares Gradio a
                    # state write and a config rebuild per update.
                    if job in self._stopped_jobs:  # the box and "Stopped." are the user's until the job ends
                        yield gr.skip(), shown_now, gr.skip(), gr.skip()
                    else:
                        yield EMPTY_BOX, shown_now, p.status, gr.skip()
                    continue
                tab = {**tab, "job": None}
                # Locked: open the box with no value, which keeps a draft typed after Stop (the first update
                # cleared the question already). Never locked: only the submitted text needs clearing.
                status = self._final_status(p, follow_up)
                if not tab.get("has_image") and p.state == "done":
                    status = f"{wording.NO_PICTURE_YET} · {status}"
                box = gr.skip() if job in self._stopped_jobs else _box_as_sent() if locked else EMPTY_BOX
                yield box, base + [assistant_message(self._final_bubble(p))], status, tab
                self._record(p, follow_up)
        finally:
            if answering_since is not None:
                self.answer_time.charge(caller.address, time.monotonic() - answering_since)
            self._stopped_jobs.discard(job)
            self.metrics.active_streams.dec()
            if not finished:  # tab closed (or reloaded), Stop, or the server shutting down: free the engine slot
                self._cancel_unless_followed(user, job)
            elif lost:  # given up on: free its dispatch slot and its conversation, or both stay "answering"
                self._cancel_quietly(user, job)

    def _submit(self, caller, tab, text, checked, image_sha, sampling, shown, new_conversation=False):
        """In one thread hop: read the chat shown so far (unless given), then admit the turn atomically
        (limits first; only then are the image, the conversation and the turn stored). Returns
        ((shown, stored turns it shows), job id, image sha, error); sets ``tab["conversation"]`` for a new chat."""
        if shown is None:
            shown = self._shown(caller.user, tab)
        try:
            conv = None if new_conversation else tab.get("conversation")
            admitted = self.client.submit(caller.user, conv, text, image=checked.data if checked else None,
                                          image_sha=image_sha, sampling=sampling, group=caller.group,
                                          notify=self.hub.started_key)
        except ConversationCleared as exc:  # it gave way to newer ones: the next question starts a new one
            tab.update(conversation=None, images={}, has_image=False, refusals=[])
            return ([], 0), None, image_sha, exc
        except Exception as exc:
            return shown, None, image_sha, exc
        tab["conversation"] = admitted.conv
        tab["user"] = caller.user
        return shown, admitted.job, admitted.image_sha, None

    # ---- stop and new conversation -------------------------------------------------------------------

    def stop(self, tab, browser_id, request: gr.Request):
        """Cancel the answer in progress (its engine slot is freed within one step)."""
        tab = dict(tab or new_tab_state())
        if not self._cancel_as_caller(request, browser_id, tab.get("job")):
            # Nothing of the caller's was running (it had ended, or the tab's job is someone else's: a
            # client can name any session hash). Say so, and leave the tab exactly as it was.
            return _box(False), wording.NOTHING_TO_STOP, tab
        self._stopped_jobs.add(tab["job"])  # its stream ends soon; until then it leaves the box alone
        return _box(False), wording.CANCELLED, {**tab, "job": None}

    def new_conversation(self, tab, browser_id, request: gr.Request):
        """Forget the current chat and end the caller's answer in progress; the next question starts afresh.

        Only the caller's own: a tab whose chat or streaming answer belongs to another identity (a client
        can name any session hash) is left exactly as it was.
        """
        tab = tab or new_tab_state()
        try:
            user = self._caller(request, browser_id).user
        except IdentityRequired:
            user = None
        session_hash = getattr(request, "session_hash", None)
        if _belongs_to_another(tab, user) or self.live.owner(session_hash) not in (None, user):
            return gr.skip(), gr.skip(), wording.NOT_YOUR_SESSION, gr.skip()
        if user is not None:
            self.live.abandon(session_hash, user)
            self._cancel_quietly(user, tab.get("job"))
        # The tab stays its owner's, so a later load under its hash cannot claim it (see on_load).
        fresh = {**new_tab_state(), "user": user} if user is not None else new_tab_state()
        return _box(False), [], wording.NEW_CONVERSATION, fresh

    # ---- helpers ---------------------------------------------------------------------------------------

    def _shown(self, user, tab) -> tuple[list[dict], int]:
        """The chat as the tab shows it: the stored conversation as messages, with the tab's refused questions, and
        how many stored turns that is (none for a new chat, or if it cannot be read)."""
        turns = []
        if tab.get("conversation"):
            try:
                turns = self.client.history(user, tab["conversation"])
            except Exception:
                turns = []
        return render_history(turns, tab.get("images") or {}, tab.get("refusals") or []), len(turns)

    def _pictures_back(self, caller, conv) -> dict[str, str]:
        """A reopened conversation's pictures as files this caller's address may be shown (sha256 -> path)."""
        try:
            return write_back(self.client.conversation_images(caller.user, conv), caller.address, self.uploads)
        except Exception:  # Redis unavailable, or the conversation just expired: placeholders then
            log.warning("could not show a reopened conversation's pictures", exc_info=True)
            return {}

    def _cancel_unless_followed(self, user, job) -> None:
        """Cancel ``job`` after ``RELOAD_GRACE_S`` unless a stream follows it by then (the hub's subscriptions): a
        reload closes the old tab's stream a moment before the new page (or another tab) follows the same answer,
        which it must not find cancelled."""
        loop = asyncio.get_running_loop()

        def cancel_if_unfollowed():
            if not self.hub.following(job):
                self.metrics.cancels.inc()
                self.metrics.turns.labels("cancelled").inc()
                loop.run_in_executor(None, self._cancel_quietly, user, job)
        loop.call_later(RELOAD_GRACE_S, cancel_if_unfollowed)

    def _first_answer(self, user) -> str | None:
        """The user's newest conversation while its first answer is still being made (None if Redis cannot say)."""
        if user is None:
            return None
        try:
            found = self.client.first_answer(user)
        except Exception:
            return None
        return found[0] if found else None

    def _pending_job(self, user, conv) -> str | None:
        """The job still answering the conversation's last question, if any (None if Redis cannot say)."""
        try:
            return self.client.pending_job(user, conv)
        except Exception:
            return None

    def _cancel_as_caller(self, request, browser_id, job) -> bool:
        """Cancel ``job`` if the caller owns it; True if it was cancelled. A caller without a valid identity
        cancels nothing."""
        try:
            return self._cancel_quietly(self._caller(request, browser_id).user, job)
        except IdentityRequired:
            return False

    def _cancel_quietly(self, user, job) -> bool:
        """True if ``job`` was live and is now cancelled; False if it had ended, is not ``user``'s, or Redis failed."""
        if not job:
            return False
        try:
            return bool(self.client.cancel(user, job))
        except UnknownJob:  # expired, or someone else's
            return False
        except Exception:
            log.warning("cancel of %s failed", job, exc_info=True)
            return False

    def _error_text(self, exc: Exception, address: str | None = None) -> str:
        return self.turn_errors.sentence(exc, address)

    def _final_bubble(self, p) -> str:
        if p.state in ("error", "lost"):
            return (p.answer + "\n\n" if p.answer else "") + wording.warning(p.error)
        if p.state == "cancelled":
            return (p.answer + " " if p.answer else "") + "*(stopped)*"
        return p.answer  # exactly the stored turn; how it ended goes in the status line

    def _final_status(self, p, follow_up: bool) -> str:
        if p.state == "done":
            return wording.answered(p.total_s, p.stats, p.first_token_s, follow_up, p.finish_reason)
        if p.state == "cancelled":
            return wording.STOPPED
        return wording.warning(p.error or wording.ANSWER_FAILED)

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


_MISSING = object()


def _chat_event(data) -> tuple[int | None, object]:
    """(message index, message value) of a chatbot retry/edit event; index None when the event data has none
    usable. Gradio sends ``{"index": 2, "value": ...}`` (the index may come as ``[row, column]``)."""
    raw = event_data(data)
    if not isinstance(raw, Mapping):
        return None, _MISSING
    index = raw.get("index")
    if isinstance(index, (list, tuple)) and index:
        index = index[0]
    if isinstance(index, bool) or not isinstance(index, int):
        index = None
    return index, raw.get("value", _MISSING)
