"""New sessions must not end another visitor's answer in flight (ui.gradio_adapters.tab_queues).

Gradio's per-session message queues lived in an LRUCache(2000) that dropped the oldest-created session when a new
one came, busy or not: 2,000 cheap new sessions (a few addresses, each inside its new-tab budget) made every
answer then streaming fail with "session not found"."""
from __future__ import annotations

import time

import pytest

from tests.security.attack import gradio_client, http, identity
from tests.security.pages import page_without_worker
from ui.gradio_adapters.tab_queues import LiveTabQueues

pytestmark = pytest.mark.timeout(180)


class FakeQueue:
    def __init__(self):
        self.pending_event_ids_session: dict[str, set] = {}
        self.event_ids_to_events: dict[str, object] = {}  # queued or running

    def start(self, session: str, event: str) -> None:
        self.pending_event_ids_session.setdefault(session, set()).add(event)
        self.event_ids_to_events[event] = object()


def test_least_recently_used_idle_session_goes_and_a_busy_one_never():
    queue = FakeQueue()
    queues = LiveTabQueues(queue, max_size=3)
    for key in ("old-busy", "a", "b"):
        queues[key] = key
    queue.start("old-busy", "event-1")
    queues["a"]  # read: now more recent than "b"
    queues["c"] = "c"
    assert list(queues) == ["old-busy", "a", "c"], "b, idle and least recently used, made room"
    queues["d"] = "d"
    assert "old-busy" in queues and "a" not in queues
    for k in list(queues):
        queue.start(k, "e-" + k)
    queues["e"] = "e"
    assert len(queues) == 4, "every session busy: it grows rather than drop an answer in flight"
    queues["c"] = "c2"
    assert queues["c"] == "c2" and len(queues) == 4, "setting a known session adds nothing"
    copied = LiveTabQueues(FakeQueue(), max_size=2, items=[("x", 1), ("y", 2), ("z", 3)])
    assert list(copied) == ["y", "z"], "the entries it starts from are kept within its size too"


def test_a_session_whose_finished_events_are_never_read_can_make_room():
    queue = FakeQueue()
    queues = LiveTabQueues(queue, max_size=2)
    queues["unread"], queues["answering"] = "messages nobody reads", "tokens"
    queue.start("unread", "done-1")
    queue.event_ids_to_events.pop("done-1")  # finished; its completion waits for a reader that never comes
    queue.start("answering", "running-1")
    queues["new"] = "new"
    assert list(queues) == ["answering", "new"], "the unread one went, the answer in flight stayed"
    assert "unread" not in queue.pending_event_ids_session, "and Gradio's pending ids for it with it"


def test_a_flood_of_new_sessions_does_not_end_an_answer_in_flight():
    pages = []

    def scaled_down(page) -> None:
        queues = page._queue.pending_messages_per_session
        assert isinstance(queues, LiveTabQueues)
        queues.max_size = 4  # Gradio's 2,000, scaled down so a test reaches it
        pages.append(page)

    with page_without_worker("sec-queues", before_launch=scaled_down) as (url, _client):
        queues = pages[0]._queue.pending_messages_per_session
        visitor = gradio_client(url, "198.51.100.40")
        # No worker: the job stays queued and its answer stream stays open, showing the queue position.
        job = visitor.submit({"text": "Describe it.", "files": []}, 16, visitor.owlet_token, api_name="/chat")
        deadline = time.monotonic() + 30
        while not job.outputs():
            assert time.monotonic() < deadline, "the question never showed in the visitor's stream"
            time.sleep(0.1)
        for i in range(12):  # three times the store's size in new sessions, from other addresses
            assert identity(http(forwarded=f"203.0.113.{50 + i}"), url).startswith("v1.")
        assert visitor.session_hash in queues, "the session with an answer in flight was kept"
        assert len(queues) <= 4 + 1
        _box, stop_status = visitor.predict(visitor.owlet_token, api_name="/stop")
        assert stop_status.startswith("Stopped."), stop_status
        _box, _chat, status = job.result(timeout=30)  # the stream ends normally, not "session not found"
        assert status == "Stopped.", status


def test_the_page_keeps_a_bounded_number_of_idle_sessions_messages():
    """Unread answers of finished events stay until their session is dropped: a client can leave
    about 1 MB in each of its sessions, and Gradio's store kept 2,000 such sessions."""
    from ui.gradio_adapters.tab_queues import MESSAGE_STORE_TABS, keep_tabs_with_answers

    class Page:
        class _queue:
            pending_messages_per_session = type("Gradios", (dict,), {"max_size": 2000})()
            pending_event_ids_session: dict = {}
            event_ids_to_events: dict = {}

    page = Page()
    keep_tabs_with_answers(page)
    queues = page._queue.pending_messages_per_session
    assert isinstance(queues, LiveTabQueues) and queues.max_size == MESSAGE_STORE_TABS <= 512
    for i in range(3 * MESSAGE_STORE_TABS):  # finished events whose completions nobody reads
        queues[f"s{i}"] = ["an unread 114 KB answer"]
    assert len(queues) == MESSAGE_STORE_TABS
