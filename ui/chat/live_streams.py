"""Which answer stream is running in which page session, and whose it is.

"New conversation" (and the Chatbot's clear button) must end the answer streaming into the same page. Gradio's
``cancels=`` did that by the event's session hash, but a client names its own session hash: a stranger who
sent a victim's hash could end the victim's answer. Here a stream is registered under its session hash with
the identity that asked, and only that identity can abandon it. An abandoned stream sends nothing more to the
page (so a fresh chat is not overwritten by the old answer) and its job is cancelled as it closes.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(eq=False)
class LiveStream:
    user: str
    abandoned: bool = False


class LiveStreams:
    """The newest answer stream per session hash (one page or API client session)."""

    def __init__(self):
        self._by_session: dict[str, LiveStream] = {}

    def start(self, session_hash: str | None, user: str) -> LiveStream:
        stream = LiveStream(user)
        if session_hash:
            self._by_session[session_hash] = stream  # a newer question in the same session replaces the entry
        return stream

    def end(self, session_hash: str | None, stream: LiveStream) -> None:
        if session_hash and self._by_session.get(session_hash) is stream:
            del self._by_session[session_hash]

    def owner(self, session_hash: str | None) -> str | None:
        """The identity whose answer is streaming in this session, if any."""
        stream = self._by_session.get(session_hash) if session_hash else None
        return stream.user if stream else None

    def abandon(self, session_hash: str | None, user: str) -> bool:
        """Mark ``user``'s stream in this session abandoned; False (and nothing changed) if there is none, or
        the stream there is someone else's."""
        stream = self._by_session.get(session_hash) if session_hash else None
        if stream is None or stream.user != user:
            return False
        stream.abandoned = True
        return True

    def __len__(self) -> int:
        return len(self._by_session)
