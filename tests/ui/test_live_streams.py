"""Who may end an answer stream: only the identity that asked, in the session it runs in (ui.chat.live_streams)."""
from __future__ import annotations

from ui.chat.live_streams import LiveStreams


def test_only_the_asker_can_abandon_its_stream_and_a_newer_question_takes_the_session_over():
    live = LiveStreams()
    first = live.start("tab-1", "anon:alice")
    assert live.owner("tab-1") == "anon:alice" and live.owner("tab-2") is None
    assert not live.abandon("tab-1", "anon:mallory") and not first.abandoned, "a stranger abandons nothing"
    assert not live.abandon("tab-2", "anon:alice"), "nothing runs in another session"
    second = live.start("tab-1", "anon:alice")  # a newer question in the same tab
    live.end("tab-1", first)  # the older stream ending must not drop the newer one
    assert live.owner("tab-1") == "anon:alice" and len(live) == 1
    assert live.abandon("tab-1", "anon:alice") and second.abandoned and not first.abandoned
    live.end("tab-1", second)
    assert live.owner("tab-1") is None and len(live) == 0


def test_a_stream_without_a_session_hash_is_never_registered():
    live = LiveStreams()
    stream = live.start(None, "anon:alice")
    assert len(live) == 0 and not live.abandon(None, "anon:alice") and not stream.abandoned
    live.end(None, stream)
