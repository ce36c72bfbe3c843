"""Gradio's state per tab (per Gradio "session"), kept so that new tabs never push out a tab that is still open.

Every tab's ``gr.State`` (the conversation it is in, its pictures, the answer it is streaming) lives in Gradio's
``StateHolder``: 10,000 sessions, and past that the least recently *used* one is dropped, open tab or not. The
new-tab budget (``ui.edge.tab_budget``) holds each address to 240 new sessions per 10 minutes, so about 42 addresses
(an IPv6 tunnel's /48 holds 65,536 /64s, each its own address here) pushed every other tab out: 10,250 ``/run/identity``
calls from 50 addresses in 39 s, and a visitor's next question in the same tab lost its chat and picture ("I only know
about shapes…"), and a Stop would have found nothing to stop.

With ``keep_open_tabs_states``, the session dropped is the least recently used one with no open heartbeat (a tab
the page has open keeps one, an answer in flight included; ``ui.edge.tab_guard`` records them). If every session
has one the holder grows past its capacity instead; that is bounded by the connections an address may hold
(``ui.edge.held_connections``). Pending events alone do not keep a session: Gradio counts an event pending until its
client reads the completion, so a client that never reads would keep its sessions forever.
"""
from __future__ import annotations

import types
from collections import OrderedDict

from ui.gradio_adapters.internals import Patch, replace, require, require_parameters, require_type, state_holder

OPEN_TABS_ATTRIBUTE = "_owlet_open_tabs"


def open_tabs_of(page) -> set[str]:
    """The set of session hashes with an open heartbeat, shared by the tab guard and the state holder."""
    tabs = getattr(page, OPEN_TABS_ATTRIBUTE, None)
    if tabs is None:
        tabs = set()
        setattr(page, OPEN_TABS_ATTRIBUTE, tabs)
    return tabs


def keep_open_tabs_states(page) -> list[Patch]:
    """After ``page.launch`` (which makes the state holder): drop only idle tabs' state."""
    holder = state_holder(page)
    require_type(holder, "session_data", OrderedDict)
    require_type(holder, "time_last_used", dict)
    require_type(holder, "capacity", int)
    require(holder, "lock")
    require_parameters(holder, "update", ("session_id",))
    open_tabs = open_tabs_of(page)

    def update(self, session_id: str) -> None:
        with self.lock:
            if session_id in self.session_data:
                self.session_data.move_to_end(session_id)
            while len(self.session_data) > self.capacity:
                idle = next((s for s in self.session_data if s != session_id and s not in open_tabs), None)
                if idle is None:  # every tab is in use: hold them all
                    return
                del self.session_data[idle]
                self.time_last_used.pop(idle, None)

    return [replace(holder, "update", types.MethodType(update, holder))]
