"""What Owlet reads of Gradio's queue bookkeeping, in one place, so a Gradio upgrade that renames it breaks here.

Gradio keeps three maps Owlet's guards depend on (``gradio.queueing.Queue``):

- ``pending_event_ids_session``: session hash → ids of its events the client has not yet read the completion of
  (queued, running, or finished but unread);
- ``event_ids_to_events``: event id → the event, while it is queued or running;
- ``pending_messages_per_session``: session hash → the messages waiting for its stream (``ui.session_queues``).

A Gradio without them reads as empty maps: nothing pending, nothing live, no message queue (so every stream would
get 404). The tests run the pinned Gradio through these guards, so a rename shows there first.
"""
from __future__ import annotations


def pending_by_session(queue) -> dict:
    """The live ``session hash → pending event ids`` map (mutable: callers may drop a session from it)."""
    return getattr(queue, "pending_event_ids_session", {})


def pending_events(queue, session_hash: str):
    """Ids of the session's events whose completion its client has not read (running ones included)."""
    return pending_by_session(queue).get(session_hash) or ()


def live_events(queue) -> dict:
    """``event id → event`` for events still queued or running."""
    return getattr(queue, "event_ids_to_events", {})


def has_message_queue(queue, session_hash: str) -> bool:
    """Whether Gradio keeps a message queue for the session, so a stream of it has something to read."""
    return session_hash in getattr(queue, "pending_messages_per_session", {})
