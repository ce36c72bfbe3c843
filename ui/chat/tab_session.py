"""A tab's session: loading the page (identity, reopened chat), following an answer after a reload, what the
browser keeps, Stop and "New conversation".

Only the caller's own: a client can name any session hash, so every event here first checks that the tab (and
the answer streaming in it) belongs to the caller, and otherwise changes nothing and learns nothing.
"""
from __future__ import annotations

import asyncio
import time

import gradio as gr

from ui.chat.event_guard import EventGuard
from ui.chat.input_box import box
from ui.chat.live_streams import LiveStreams
from ui.chat.page_reads import PageReads
from ui.chat.streaming import AnswerStreams
from ui.chat.tab_state import belongs_to_another, in_use, new_tab_state
from ui.chat.view import render_history
from ui.identity import IdentityRequired
from ui.shared import wording
from worker.errors import ConversationCleared

RESUME_SLOT_WAIT_S = 20.0  # how long a reloaded page waits for its address's event slot to follow its answer


def remembered(conversation: str | None) -> dict:
    """What the browser keeps (``gr.BrowserState``) so a reload reopens its chat: the chat (None: a new one) and when
    it was remembered, by this page's clock, the clock SUBMIT stores a conversation's creation in."""
    return {"conversation": conversation, "at": time.time()}


def unseen_since(stored) -> float | None:
    """From what a browser keeps, the time after which a chat is one it does not know: when it last remembered one
    (``at``), or -inf when it keeps nothing (it never remembered a chat). None when the kept value names no such time
    (kept by an earlier version, or not a dict): then only a first answer still being made is reopened."""
    if stored is None:
        return float("-inf")
    at = stored.get("at") if isinstance(stored, dict) else None
    if isinstance(at, (int, float)) and not isinstance(at, bool):
        return float(at)
    return None


class TabSession:
    def __init__(self, client, issuer, guard: EventGuard, streams: AnswerStreams, reads: PageReads,
                 live: LiveStreams):
        self.client, self.issuer, self.guard, self.streams, self.reads, self.live = (
            client, issuer, guard, streams, reads, live)

    def on_load(self, stored_browser_id, stored_conversation, tab, request: gr.Request):
        """Give this browser a lasting id (kept in localStorage) and reopen its last conversation, if any.

        The conversation is reopened only if this user still owns it and it has not expired; otherwise the page
        starts with an empty chat (saying so when it gave way to the service's history budget). A new conversation
        whose first answer is still being made, or one made after the browser last remembered a chat, is newer than
        the one the browser remembers (it learns the id one step after that answer ends): that one is reopened, and
        the browser told to remember it. The page loads once per tab:
        a load under a session hash that is already in use (a client can name any hash, and this event answers on
        the API routes too) changes nothing, so nobody can swap their identity or conversation into another tab.
        """
        session_hash = getattr(request, "session_hash", None)
        if in_use(tab) or self.live.owner(session_hash) is not None:
            return gr.skip(), gr.skip(), wording.NOT_YOUR_SESSION, gr.skip(), gr.skip()
        browser_id = self.issuer.ensure(stored_browser_id)
        tab = new_tab_state()
        try:
            caller = self.guard.caller(request, browser_id)
            user = caller.user
        except IdentityRequired:  # cannot happen with a token just ensured; the chat then stays unowned
            caller = user = None
        if user is not None:
            tab["user"] = user  # the tab is the user's from here on: a later load under its hash changes nothing
        # The browser learns a new conversation's id only when its first answer ends, and remembers any chat one step
        # after its answer's last update: a reload before then finds on the server the chat it does not know yet,
        # one still answering its first question or one created after the browser last remembered (a chat left
        # with "New conversation" before the browser last remembered is older than that, and stays closed).
        since = unseen_since(stored_conversation)
        reopened = self.reads.first_answer(user)
        if reopened is None and since is not None:
            reopened = self.reads.newest_since(user, since)
        if isinstance(stored_conversation, dict):  # what remember_conversation stored: {"conversation": id, "at": t}
            stored_conversation = stored_conversation.get("conversation")
        # The browser also remembers leaving a chat with "New conversation" one step after the chat was cleared: a
        # reload in between still finds the left chat kept (or newest on the server). The server records the leaving
        # (LEAVE), and a chat left after the browser last remembered stays closed.
        if reopened and self._left_since(user, reopened, since):
            reopened = None
        forget = isinstance(stored_conversation, str) and self._left_since(user, stored_conversation, since)
        if forget:
            stored_conversation = None
        conversation = reopened or stored_conversation
        if user is not None and isinstance(conversation, str) and conversation:
            try:
                turns = self.client.history(user, conversation)
            except ConversationCleared as exc:  # it gave way to newer ones: say so, and forget it
                return browser_id, [], exc.user_message, tab, remembered(None)
            except Exception:  # expired, not this user's, or Redis unavailable: start afresh
                turns = []
            if turns:
                tab["conversation"] = conversation
                tab["has_image"] = any(turn.get("image_sha") for turn in turns)
                tab["job"] = self.reads.pending_job(user, conversation)  # resume() streams it
                tab["images"] = self.reads.pictures_back(caller, conversation) if tab["has_image"] else {}
                return (browser_id, render_history(turns, tab["images"]),
                        wording.RESTORED_ANSWERING if tab["job"] else wording.RESTORED, tab,
                        remembered(conversation) if reopened else gr.skip())
        return browser_id, [], "", tab, remembered(None) if forget else gr.skip()

    def _left_since(self, user, conversation: str, since: float | None) -> bool:
        """Whether ``user`` left ``conversation`` with "New conversation" after ``since`` (the browser's last
        remembering; None: unknown, so any leaving counts)."""
        left = self.reads.left_at(user, conversation)
        return left is not None and (since is None or left >= since)

    async def resume(self, tab, browser_id, request: gr.Request):
        """After a reload: keep streaming the restored conversation's answer still in progress (``on_load`` put
        its job in the tab), as the tab that asked would have, so a question asked before a reload is answered in
        the reloaded page."""
        job = tab.get("job") if isinstance(tab, dict) else None
        if not job:
            yield gr.skip(), gr.skip(), gr.skip(), gr.skip()
            return
        # The reloaded tab's own stream may hold its address's slot until Gradio notices it closed (seconds):
        # wait for it rather than refuse a page that asked nothing new (four people behind one address, one
        # reloads: it is not told "Too many answers are open" while its answer is on its way).
        async for update in self.guard.run(request, browser_id, tab, lambda caller: self._resume(
                tab, caller, job), slot_wait_s=RESUME_SLOT_WAIT_S):
            yield update

    async def _resume(self, tab, caller, job):
        tab = dict(tab)
        started = time.monotonic()
        base, _stored = await asyncio.to_thread(self.reads.shown, caller.user, tab)
        async for update in self.streams.stream(caller, tab, job, base, started):
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
            user = self.guard.caller(request, browser_id).user
        except IdentityRequired:
            return gr.skip()
        if belongs_to_another(tab, user):
            return gr.skip()
        return remembered(tab.get("conversation"))

    def stop(self, tab, browser_id, request: gr.Request):
        """Cancel the answer in progress (its engine slot is freed within one step)."""
        tab = dict(tab or new_tab_state())
        if not self._cancel_as_caller(request, browser_id, tab.get("job")):
            # Nothing of the caller's was running (it had ended, or the tab's job is someone else's: a
            # client can name any session hash). Say so, and leave the tab exactly as it was.
            return box(False), wording.NOTHING_TO_STOP, tab
        self.streams.stopped(tab["job"])  # its stream ends soon; until then it leaves the box alone
        return box(False), wording.CANCELLED, {**tab, "job": None}

    def new_conversation(self, tab, browser_id, request: gr.Request):
        """Forget the current chat and end the caller's answer in progress; the next question starts afresh.

        Only the caller's own: a tab whose chat or streaming answer belongs to another identity (a client
        can name any session hash) is left exactly as it was.
        """
        tab = tab or new_tab_state()
        user = self.guard.user_or_none(request, browser_id)
        session_hash = getattr(request, "session_hash", None)
        if belongs_to_another(tab, user) or self.live.owner(session_hash) not in (None, user):
            return gr.skip(), gr.skip(), wording.NOT_YOUR_SESSION, gr.skip()
        if user is not None:
            self.live.abandon(session_hash, user)
            self.reads.cancel(user, tab.get("job"))
            # The browser remembers leaving the chat one step later: a reload before then must not reopen it (on_load).
            if tab.get("user") == user:
                self.reads.leave(user, tab.get("conversation"), time.time())
        # The tab stays its owner's, so a later load under its hash cannot claim it (see on_load).
        fresh = {**new_tab_state(), "user": user} if user is not None else new_tab_state()
        return box(False), [], wording.NEW_CONVERSATION, fresh

    def _cancel_as_caller(self, request, browser_id, job) -> bool:
        """Cancel ``job`` if the caller owns it; True if it was cancelled. A caller without a valid identity
        cancels nothing."""
        try:
            return self.reads.cancel(self.guard.caller(request, browser_id).user, job)
        except IdentityRequired:
            return False
