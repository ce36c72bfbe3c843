"""Who may run an answering event, and how many at once: the gate every asking or resuming event passes.

An event runs for its caller only if the caller has an identity, the tab is not another identity's, and the
caller's address holds a free event slot (``address_max_events``; a reloaded page waits a while for one). An
address braked after too many refusals (``ui.edge.refusal_brake``) gets its sentence after a delay, holding its
slot meanwhile. The running event is registered as the tab's live stream (``ui.chat.live_streams``), so "New
conversation" ends it.
"""
from __future__ import annotations

import asyncio
import contextlib

import gradio as gr

from ui.chat.input_box import box_as_sent
from ui.chat.live_streams import LiveStreams
from ui.chat.page_reads import PageReads
from ui.chat.tab_state import belongs_to_another, new_tab_state
from ui.chat.turn_errors import TurnErrors
from ui.edge.refusal_brake import BRAKE_DELAY_S, RefusalLedger, braked_sentence
from ui.identity import ClientAddresses, IdentityRequired, identify
from ui.shared import wording
from ui.shared.address_slots import AddressSlots, SlotRefused

TOO_MANY_EVENTS = ("Too many answers are open from your network at once. Wait for one to finish (or stop it), "
                   "then ask again.")


class EventGuard:
    def __init__(self, issuer, addresses: ClientAddresses, max_events: int, refusals: RefusalLedger,
                 live: LiveStreams, reads: PageReads, errors: TurnErrors):
        self.issuer, self.addresses, self.refusals, self.live = issuer, addresses, refusals, live
        self.reads, self.errors = reads, errors
        # Reloaded pages wait for a slot (resume); as many may wait as may hold one, so one client cannot park
        # a crowd of waiting events on the page.
        self.event_slots = AddressSlots(max_events, TOO_MANY_EVENTS, max_waiting=max_events)

    def caller(self, request, browser_id):
        """Who is asking and from where; raises IdentityRequired for an anonymous call without a valid token."""
        return identify(request, browser_id, self.issuer, self.addresses)

    def user_or_none(self, request, browser_id):
        """The caller's identity, or None for a call without a valid one."""
        try:
            return self.caller(request, browser_id).user
        except IdentityRequired:
            return None

    async def run(self, request, browser_id, tab, turn, slot_wait_s: float = 0.0):
        """Run one answering event for its caller while that caller's address holds a free event slot.

        ``turn(caller)`` is the event's async generator. A caller without identity, or an address already
        holding ``address_max_events`` answers (after waiting up to ``slot_wait_s`` for one), gets a sentence
        instead of a Gradio thread; a braked address gets its sentence after a delay, holding its slot meanwhile.
        """
        caller = None
        try:
            caller = self.caller(request, browser_id)
            if belongs_to_another(tab, caller.user):
                yield box_as_sent(), gr.skip(), wording.NOT_YOUR_SESSION, gr.skip()
                return
            await self.event_slots.acquire_within(caller.address, slot_wait_s, poll_s=0.25)
            try:
                braked_s = self.refusals.braked_for(caller.address)
                if braked_s is not None:  # asked again and again after refusals: slowed, holding its slot
                    self.refusals.braked()
                    await asyncio.sleep(BRAKE_DELAY_S)
                    yield box_as_sent(), gr.skip(), braked_sentence(braked_s), gr.skip()
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
                                # the stream's last update, which would bring the old chat back, box locked.
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
            chat = gr.skip() if caller is None else (await asyncio.to_thread(self.reads.shown, caller.user, tab))[0]
            yield box_as_sent(), chat, self.errors.sentence(exc, self.addresses.of(request)), tab
