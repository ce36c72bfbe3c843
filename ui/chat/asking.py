"""Asking a turn: a new question (``respond``), a retried one (``retry``) or an edited one (``edit``).

Each checks its input, admits the turn through the worker client (limits first; only then are the image, the
conversation and the turn stored), then streams the answer (``ui.chat.streaming``). A refused turn stays in the
chat with its reason under it, and the box gives the question back. Every event runs behind the ``EventGuard``.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

import gradio as gr

from ui.chat.event_guard import EventGuard
from ui.chat.input_box import box, box_as_sent
from ui.chat.page_reads import PageReads
from ui.chat.streaming import AnswerStreams
from ui.chat.tab_state import new_tab_state, with_refusal
from ui.chat.turn_errors import TurnErrors
from ui.chat.view import (REFUSED, assistant_message, message_text, message_turns, parse_input, render_history,
                          then_asked, user_message)
from ui.gradio_adapters.internals import event_data
from ui.shared import wording
from ui.shared.address_slots import SlotRefused
from ui.uploads.image_check import DecodePool, UploadLimits, UploadRejected
from ui.uploads.room import UploadRoom
from worker.errors import ConversationCleared
from worker.store.jobs import unencodable


class Asking:
    def __init__(self, client, config, metrics, guard: EventGuard, streams: AnswerStreams, reads: PageReads,
                 errors: TurnErrors, upload_room: UploadRoom | None):
        self.client, self.config, self.metrics = client, config, metrics
        self.guard, self.streams, self.reads, self.errors = guard, streams, reads, errors
        self.upload_room = upload_room  # an admitted turn's picture is marked used: it gives way last
        self.limits = UploadLimits.from_config(config)
        self.decoder = DecodePool(config.decode_workers, config.address_max_decodes)

    # ---- a new question ---------------------------------------------------------------------------

    async def respond(self, message, max_new_tokens, tab, browser_id, request: gr.Request):
        """Check the input, submit the turn, then stream queue position, tokens and final stats."""
        async for update in self.guard.run(request, browser_id, tab, lambda caller: self._respond(
                message, max_new_tokens, tab, caller)):
            yield update

    async def _respond(self, message, max_new_tokens, tab, caller):
        tab = dict(tab or new_tab_state())
        text, files = parse_input(message)
        if not text and not files:
            yield box_as_sent(), gr.skip(), wording.EMPTY_MESSAGE, tab
            return
        if len(files) > 1:
            yield box_as_sent(), gr.skip(), wording.ONE_IMAGE_ONLY, tab
            return
        if len(text) > self.config.max_text_chars:
            yield box_as_sent(), gr.skip(), wording.too_long(self.config.max_text_chars), tab
            return
        # (said before anything echoes the text: Gradio cannot send text without a UTF-8 form back to the browser)
        refusal = unencodable("Your question", text)
        if refusal:
            yield box_as_sent(), gr.skip(), refusal, tab
            return
        checked = None
        if files:
            try:
                checked = await self.decoder.check(files[0], self.limits, caller.address)
            except SlotRefused as exc:
                shown, _stored = await asyncio.to_thread(self.reads.shown, caller.user, tab)
                yield box_as_sent(), shown, self.errors.sentence(exc, caller.address), tab
                return
            except UploadRejected as exc:
                self.metrics.errors.labels(exc.metric_kind).inc()
                self.metrics.turns.labels("rejected").inc()
                note = exc.user_message  # what is wrong and what to do: "This picture is too large: ..."
                shown, stored = await asyncio.to_thread(self.reads.shown, caller.user, tab)
                question, reason = user_message(text or wording.DEFAULT_IMAGE_PROMPT), wording.warning(note)
                tab = with_refusal(tab, stored, question, reason)
                yield box(False, text), then_asked(shown, question) + [assistant_message(reason)], note, tab
                return
        # A new picture starts a new conversation (once admitted: a refused turn leaves the chat as it was). The
        # model would otherwise see both pictures and answer about either (the bundled model mixes them).
        async for update in self._submit_and_stream(caller, tab, text or wording.DEFAULT_IMAGE_PROMPT,
                                                    checked, files[0] if files else None, None,
                                                    sampling=self._sampling(max_new_tokens),
                                                    new_conversation=bool(checked and tab.get("conversation"))):
            yield update

    # ---- retry and edit: truncate the stored history, then ask again --------------------------------

    # The event data is read as plain ``gr.EventData``, not ``gr.RetryData``/``gr.EditData``: those parse it
    # inside Gradio, so an API call without it (or with a malformed one) would fail there with Gradio's generic
    # error before this code ran. Here it gets a sentence saying what to send.

    async def retry(self, max_new_tokens, tab, browser_id, data: gr.EventData, request: gr.Request):
        """Ask the retried question again: history is cut back to just before it."""
        index, _ = _chat_event(data)
        async for update in self.guard.run(request, browser_id, tab, lambda caller: self._redo(
                max_new_tokens, tab, caller, index, None)):
            yield update

    async def edit(self, max_new_tokens, tab, browser_id, data: gr.EventData, request: gr.Request):
        """Replace an earlier question with its edited text and answer from there."""
        index, value = _chat_event(data)

        def redo(caller):  # the value is read inside the guard: its identity and slot checks come first
            new_text = None if value is _MISSING else message_text(value)
            return self._redo(max_new_tokens, tab, caller, index if new_text is not None else None, new_text)
        async for update in self.guard.run(request, browser_id, tab, redo):
            yield update

    async def _redo(self, max_new_tokens, tab, caller, index: int | None, new_text):
        tab = dict(tab or new_tab_state())
        if index is None:
            yield box_as_sent(), gr.skip(), wording.NEEDS_MESSAGE_INDEX, tab
            return
        conv = tab.get("conversation")
        user = caller.user
        if not conv:
            yield box_as_sent(), gr.skip(), wording.NOTHING_TO_RETRY, tab
            return
        if new_text is not None and len(new_text) > self.config.max_text_chars:  # the same limit as /chat
            yield box_as_sent(), gr.skip(), wording.too_long(self.config.max_text_chars), tab
            return
        refusal = new_text is not None and unencodable("Your question", new_text)
        if refusal:
            yield box_as_sent(), gr.skip(), refusal, tab
            return
        try:
            await asyncio.to_thread(self.reads.cancel, user, tab.get("job"))
            turns = await asyncio.to_thread(self.client.history, user, conv)
            refusals = tab.get("refusals") or []
            shown_turns = message_turns(turns, refusals)  # the chat's message index, as a stored turn's index
            if index >= len(shown_turns) or (index >= 0 and shown_turns[index] == REFUSED):
                # A refused question this tab shows with its reason, never stored.
                yield box_as_sent(), gr.skip(), wording.NEVER_SENT, tab
                return
            index = shown_turns[index] if 0 <= index < len(shown_turns) else None
            if index is None or turns[index].get("role") != "user":
                yield (box_as_sent(), render_history(turns, tab["images"], refusals),
                       wording.NOT_YOUR_MESSAGE, tab)
                return
            turn = turns[index]
            await asyncio.to_thread(self.client.truncate, user, conv, index)
            # What was refused after the question asked again goes with the turns after it.
            tab["refusals"] = [item for item in refusals if item["after"] <= index]
        except Exception as exc:
            yield box_as_sent(), gr.skip(), self.errors.sentence(exc, caller.address), tab
            return
        text = new_text if new_text is not None else (turn.get("text") or "")
        text = text.strip() or wording.DEFAULT_IMAGE_PROMPT
        shown = render_history(turns[:index], tab["images"], tab["refusals"])
        async for update in self._submit_and_stream(caller, tab, text, None, None, (shown, index),
                                                    sampling=self._sampling(max_new_tokens),
                                                    image_sha=turn.get("image_sha")):
            yield update

    # ---- the shared submit + stream -----------------------------------------------------------------

    async def _submit_and_stream(self, caller, tab, text, checked, image_path, shown, sampling, image_sha=None,
                                 new_conversation: bool = False):
        """Submit the turn, then stream it. ``shown``: the chat before this turn and how many stored turns it shows
        (None: read them here). A turn the service refuses stays in the chat with the reason under it.

        A short turn costs the page little: one thread hop reads the history and submits; the box is locked
        with the first update, which waits for the job's first events (at most ``FIRST_UPDATE_S``), so an
        answer that is done by then is sent once, complete, with no lock and unlock.
        """
        started = time.monotonic()
        self.streams.watch_load()
        user = caller.user
        pending_user = user_message(text, image_path or tab["images"].get(image_sha), has_image=bool(
            checked or image_sha))
        (shown, stored), job, image_sha, error = await asyncio.to_thread(
            self._submit, caller, tab, text, checked, image_sha, sampling, shown, new_conversation)
        if error is not None:
            note = self.errors.sentence(error, caller.address)
            question, reason = user_message(text), wording.warning(note)
            tab = with_refusal(tab, stored, question, reason)
            yield box_as_sent(), then_asked(shown, question) + [assistant_message(reason)], note, tab
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
        async for update in self.streams.stream(caller, tab, job, then_asked(shown, pending_user), started):
            yield update

    def _submit(self, caller, tab, text, checked, image_sha, sampling, shown, new_conversation=False):
        """In one thread hop: read the chat shown so far (unless given), then admit the turn atomically
        (limits first; only then are the image, the conversation and the turn stored). Returns
        ((shown, stored turns it shows), job id, image sha, error); sets ``tab["conversation"]`` for a new chat."""
        if shown is None:
            shown = self.reads.shown(caller.user, tab)
        try:
            conv = None if new_conversation else tab.get("conversation")
            admitted = self.client.submit(caller.user, conv, text, image=checked.data if checked else None,
                                          image_sha=image_sha, sampling=sampling, group=caller.group,
                                          notify=self.streams.hub.started_key)
        except ConversationCleared as exc:  # it gave way to newer ones: the next question starts a new one
            tab.update(conversation=None, images={}, has_image=False, refusals=[])
            return ([], 0), None, image_sha, exc
        except Exception as exc:
            return shown, None, image_sha, exc
        tab["conversation"] = admitted.conv
        tab["user"] = caller.user
        return shown, admitted.job, admitted.image_sha, None

    def _sampling(self, max_new_tokens) -> dict:
        """Generation settings for one turn; the requested length is clamped to the configured cap."""
        try:
            n = int(max_new_tokens)
        except (TypeError, ValueError):
            n = self.config.max_new_tokens
        n = max(1, min(n, self.config.max_new_tokens_cap))
        return {"max_new_tokens": n, "temperature": self.config.temperature}


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
