"""New tabs must not push an open tab's state out of Gradio's state holder (ui.gradio_adapters.tab_states).

Gradio keeps 10,000 sessions' ``gr.State`` and dropped the least recently used one, open tab or not:
10,250 ``/run/identity`` calls from 50 addresses (each inside its new-tab budget) wiped a visitor's chat and
picture mid-conversation."""
from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tests.security.attack import gradio_client, http, identity
from tests.security.pages import page_without_worker
from ui.gradio_adapters.tab_states import keep_open_tabs_states, open_tabs_of

pytestmark = pytest.mark.timeout(180)


def fake_page(capacity: int):
    from gradio.state_holder import StateHolder

    holder = StateHolder()
    holder.capacity = capacity
    return SimpleNamespace(state_holder=holder, _queue=SimpleNamespace(pending_event_ids_session={}))


def add(holder, key: str) -> None:
    holder.session_data[key] = key
    holder.update(key)


def test_an_open_tab_keeps_its_session_and_idle_ones_go_first():
    page = fake_page(capacity=3)
    keep_open_tabs_states(page)
    holder = page.state_holder
    open_tabs_of(page).update({"open-tab", "answering"})
    page._queue.pending_event_ids_session["unread"] = {"event-1"}  # a client that never reads its completions
    for key in ("open-tab", "answering", "unread", "idle-2"):
        add(holder, key)
    assert list(holder.session_data) == ["open-tab", "answering", "idle-2"], "the least recently used idle one went"
    for i in range(10):
        add(holder, f"flood-{i}")
    assert list(holder.session_data) == ["open-tab", "answering", "flood-9"]
    open_tabs_of(page).update(holder.session_data)
    add(holder, "one-more")
    assert len(holder.session_data) == 4, "every session open: it grows rather than wipe a tab"


def test_gradios_own_holder_drops_an_open_tab_which_is_why_this_exists():
    page = fake_page(capacity=2)  # not patched
    open_tabs_of(page).add("open-tab")
    for key in ("open-tab", "a", "b"):
        add(page.state_holder, key)
    assert "open-tab" not in page.state_holder.session_data


def test_a_flood_of_new_sessions_does_not_wipe_an_open_tab():
    pages = []
    with page_without_worker("sec-states", before_launch=pages.append) as (url, _client):
        page = pages[0]
        page.state_holder.capacity = 4  # Gradio's 10,000, scaled down so a test reaches it
        visitor = gradio_client(url, "198.51.100.41")  # its heartbeat keeps the tab open, as a browser's does
        deadline = time.monotonic() + 30
        while visitor.session_hash not in open_tabs_of(page):
            assert time.monotonic() < deadline, "the visitor's heartbeat never connected"
            time.sleep(0.1)
        # No worker: the question stays queued; Stop ends the event, so the tab is open but idle.
        job = visitor.submit({"text": "Describe it.", "files": []}, 16, visitor.owlet_token, api_name="/chat")
        while not job.outputs():
            assert time.monotonic() < deadline, "the question never showed in the visitor's stream"
            time.sleep(0.1)
        visitor.predict(visitor.owlet_token, api_name="/stop")
        job.result(timeout=30)
        state = page.state_holder.session_data[visitor.session_hash]
        for i in range(12):  # three times the holder's size in new sessions, from other addresses
            assert identity(http(forwarded=f"203.0.113.{70 + i}"), url).startswith("v1.")
        assert page.state_holder.session_data.get(visitor.session_hash) is state, "the open tab was wiped"
        assert len(page.state_holder.session_data) <= 4 + 1


def test_closed_tabs_states_are_bounded_by_the_pages_setting():
    """Each tab's state is 30-60 KB (a copy of the page's config per session): Gradio's 10,000 let a week's visitors
    grow the page by hundreds of MB. ``tab_states_max`` bounds the closed ones; the open tab stays."""
    pages = []
    with page_without_worker("sec-states-max", before_launch=pages.append, tab_states_max=5) as (url, _client):
        page = pages[0]
        assert page.state_holder.capacity == 5, "the page's setting did not reach Gradio's state holder"
        visitor = gradio_client(url, "198.51.100.42")
        deadline = time.monotonic() + 30
        while visitor.session_hash not in open_tabs_of(page):
            assert time.monotonic() < deadline, "the visitor's heartbeat never connected"
            time.sleep(0.1)
        state = page.state_holder.session_data[visitor.session_hash]
        for i in range(20):  # four times the bound in new sessions, each a visitor who came and went
            assert identity(http(forwarded=f"203.0.113.{120 + i}"), url).startswith("v1.")
        assert len(page.state_holder.session_data) <= 5, "closed tabs' states outgrew tab_states_max"
        assert page.state_holder.session_data.get(visitor.session_hash) is state, "the open tab was dropped"
