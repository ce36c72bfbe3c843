"""Gradio's message queue per tab (per Gradio "session"), kept so that new tabs never push out one with an answer
in flight.

Every event's updates (each streamed token of an answer) reach the browser through its session's message queue,
``Queue.pending_messages_per_session``. Gradio keeps those in an ``LRUCache(2000)`` that drops the *oldest-created*
session when a new one arrives (reading an entry does not refresh it) and never looks at whether the session still
has an event running. So 2,000 new sessions (cheap ``/identity`` calls from a few addresses, each within its
new-tab budget) made every answer then streaming fail: the next token's ``send_message`` hit a missing key,
Gradio ended the event, and the visitor saw "session not found".

``LiveTabQueues`` is a drop-in for that mapping: least recently *used* goes first, and a session with an event still
queued or running (``Queue.event_ids_to_events``) is never dropped. If every session has one, it grows past its size
instead; that is bounded by how many events Gradio admits at all (its queue's ``max_size`` plus the running ones). An
event that has *finished* no longer keeps its session, though Gradio counts it pending
(``Queue.pending_event_ids_session``) until its client reads the completion: a client that never reads would keep every
message of its sessions forever (0.86 MB a question, for 900 KB questions handed back to the box), so such a session's
messages and pending ids go with it when room is needed.
"""
from __future__ import annotations

from collections import OrderedDict

from ui.gradio_adapters.internals import (NotAdaptable, Patch, live_events, message_queues, pending_by_session,
                                         pending_events, queue_of, replace, require_type)


class LiveTabQueues(OrderedDict):
    def __init__(self, queue, max_size: int, items=()):
        self._queue = queue  # Gradio's Queue: its pending_event_ids_session names the sessions with events pending
        self.max_size = max_size
        super().__init__()
        for key, value in items:  # through __setitem__, once the size is known
            self[key] = value

    def __getitem__(self, key):
        value = super().__getitem__(key)
        self.move_to_end(key)
        return value

    def __setitem__(self, key, value) -> None:
        if key in self:
            self.move_to_end(key)
        else:
            self._make_room()
        super().__setitem__(key, value)

    def _make_room(self) -> None:
        if len(self) < self.max_size:
            return
        idle = next((key for key in self if not self._running(key)), None)  # least recently used first
        if idle is not None:
            del self[idle]
            pending_by_session(self._queue).pop(idle, None)  # finished, never to be read

    def _running(self, session_hash) -> bool:
        """Whether one of the session's events is still queued or running (not merely unread)."""
        events = live_events(self._queue)
        return any(event_id in events for event_id in list(pending_events(self._queue, session_hash)))


# Sessions kept before an idle one goes (Gradio keeps 2,000). Only sessions with no event queued or running are
# ever dropped, and a tab's next event makes its entry again, so what a smaller store costs is the completions
# nobody read: a client leaving 7 unread answers of 114 KB in each of its sessions, about 1 MB a session, grows
# the page by 1.4 GB an hour from one address under Gradio's 2,000, to 2.5 GB.
MESSAGE_STORE_TABS = 512


def keep_tabs_with_answers(page) -> list[Patch]:
    """Swap ``page``'s message-queue mapping for ``LiveTabQueues`` (after ``page.queue(...)``, which makes the
    queue)."""
    queue = queue_of(page)
    current = message_queues(queue)
    require_type(queue, "pending_event_ids_session", dict)
    require_type(queue, "event_ids_to_events", dict)
    if isinstance(current, LiveTabQueues):
        return [Patch(queue, "pending_messages_per_session", current)]
    if not callable(getattr(current, "items", None)):
        raise NotAdaptable(f"Queue.pending_messages_per_session is a {type(current).__name__}, not a mapping")
    return [replace(queue, "pending_messages_per_session", LiveTabQueues(queue, MESSAGE_STORE_TABS, current.items()))]
