"""The page's event handlers, wired: one object that builds the chat's parts once and hands Gradio their events.

- ``ui.chat.asking.Asking``: a new, retried or edited question (``respond``, ``retry``, ``edit``);
- ``ui.chat.streaming.AnswerStreams``: an answer streamed into its tab, through the page's one stream reader;
- ``ui.chat.tab_session.TabSession``: page load, resume after a reload, Stop, "New conversation";
- ``ui.chat.event_guard.EventGuard``: identity, the address's event slots and the refusal brake, before any of it.

Handlers never raise to Gradio: every failure becomes a chat message or a status line (``ui.chat.turn_errors``),
so the user sees a sentence, never a traceback or a spinner that never ends.
"""
from __future__ import annotations

import logging

from ui.chat.asking import Asking
from ui.chat.event_guard import EventGuard
from ui.chat.live_streams import LiveStreams
from ui.chat.page_reads import PageReads
from ui.chat.streaming import AnswerStreams
from ui.chat.tab_session import TabSession
from ui.chat.turn_errors import TurnErrors
from ui.edge.refusal_brake import RefusalLedger
from ui.identity import ClientAddresses, issuer_for
from ui.uploads.owners import UploadedPaths
from ui.uploads.room import UploadRoom

log = logging.getLogger("owlet.ui")


class ChatHandlers:
    def __init__(self, client, config, metrics, uploads: UploadedPaths | None = None,
                 upload_room: UploadRoom | None = None):
        self.client, self.config, self.metrics = client, config, metrics
        self.uploads = uploads if uploads is not None else UploadedPaths()  # who uploaded each file (the page's)
        self.issuer = issuer_for(config, client, log)
        self.addresses = ClientAddresses.from_config(config)
        # Refusals per address; past a count, its turns are refused after a delay (ui.edge.refusal_brake). Shared
        # with the edge's brake, which counts the page's 429s and 503s.
        self.refusals = RefusalLedger(config.address_refusals, config.address_refusals_window_s,
                                      counted=metrics.refusals)
        self.live = LiveStreams()  # whose answer streams in which tab ("New conversation" ends only one's own)
        reads, errors = PageReads(client, self.uploads), TurnErrors(metrics, self.refusals)
        self.guard = EventGuard(self.issuer, self.addresses, config.address_max_events, self.refusals, self.live,
                                reads, errors)
        self.streams = AnswerStreams(client, config, metrics, reads)
        self.asking = Asking(client, config, metrics, self.guard, self.streams, reads, errors, upload_room)
        self.session = TabSession(client, self.issuer, self.guard, self.streams, reads, self.live)
        # What the page's other parts share: the API (ui.api.completions) asks through the same slots, decoder,
        # hub and pacer; the event-slot picker weighs each address's answer time (fair_event_slots).
        self.event_slots, self.decoder = self.guard.event_slots, self.asking.decoder
        self.hub, self.pacer, self.answer_time = self.streams.hub, self.streams.pacer, self.streams.answer_time
        # The events, as Gradio binds them (ui.app).
        self.respond, self.retry, self.edit = self.asking.respond, self.asking.retry, self.asking.edit
        self.on_load, self.resume, self.identity = self.session.on_load, self.session.resume, self.session.identity
        self.remember_conversation = self.session.remember_conversation
        self.stop, self.new_conversation = self.session.stop, self.session.new_conversation
