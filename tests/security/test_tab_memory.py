"""A tab's Gradio state must not grow with the events it runs (ui.gradio_adapters.tab_config).

Every prop update made Gradio store one more component (and its value) in the session's config: the page
grew by 0.85 MB a turn for a client sending, from one session and with no identity, 900 KB questions that Owlet
refused as too long and handed back to the box."""
from __future__ import annotations

import json
import secrets

import httpx
import pytest

from tests.security.pages import page_without_worker

pytestmark = pytest.mark.timeout(180)


def fn_index(url: str, api_name: str) -> int:
    config = httpx.get(url + "config", timeout=30).json()
    return next(dep.get("id", i) for i, dep in enumerate(config["dependencies"]) if dep.get("api_name") == api_name)


def run_event(client: httpx.Client, url: str, fn: int, data: list, session_hash: str) -> dict:
    joined = client.post(url + "gradio_api/queue/join",
                         json={"data": data, "fn_index": fn, "session_hash": session_hash, "event_data": None})
    joined.raise_for_status()
    event_id = joined.json()["event_id"]
    with client.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session_hash}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data:"):
                message = json.loads(line[5:])
                if message.get("event_id") == event_id and message.get("msg") == "process_completed":
                    return message
    raise AssertionError("the event never completed")


def test_a_sessions_state_stays_the_pages_size_however_many_turns_it_sends():
    pages = []
    with page_without_worker("sec-memory", before_launch=pages.append) as (url, _client):
        page = pages[0]
        fn, session_hash = fn_index(url, "chat"), secrets.token_hex(8)
        size = 60_000  # under the page's body cap (ui.edge.body_limits), far over its longest question
        question = {"text": "A" * size, "files": []}  # refused as too long, and handed back to the box
        with httpx.Client(timeout=60) as client:
            for _ in range(20):
                done = run_event(client, url, fn, [question, 1, None, "v1.made-up"], session_hash)
                assert done["success"], done
        state = page.state_holder.session_data[session_hash]
        assert set(state.blocks_config.blocks) <= set(page.blocks), "the session kept components of its own"
        assert set(state.config_values) <= set(page.blocks)
        kept = sum(len(json.dumps(v, default=str)) for v in state.config_values.values())
        assert kept < 3 * size, f"the session's config holds {kept} bytes after 20 turns"


def test_a_session_that_never_reads_its_answers_cannot_pile_them_up():
    """Gradio keeps an event's messages until the session's stream reads its completion: a client joined 200 events
    to one session and never read, and the page kept 0.86 MB for each (the refused question handed back)."""
    from ui.edge.tab_guard import MAX_UNREAD_EVENTS, TOO_MANY_UNREAD

    with page_without_worker("sec-unread") as (url, _client):
        fn, session_hash = fn_index(url, "chat"), secrets.token_hex(8)
        join = {"data": [{"text": "hello", "files": []}, 1, None, "v1.made-up"], "fn_index": fn,
                "session_hash": session_hash, "event_data": None}
        with httpx.Client(timeout=60) as client:
            codes = [client.post(url + "gradio_api/queue/join", json=join).status_code
                     for _ in range(MAX_UNREAD_EVENTS)]
            assert codes == [200] * MAX_UNREAD_EVENTS
            refused = client.post(url + "gradio_api/queue/join", json=join)
            assert refused.status_code == 429 and refused.text == TOO_MANY_UNREAD
            completed = 0
            with client.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session_hash}) as stream:
                for line in stream.iter_lines():
                    if line.startswith("data:") and json.loads(line[5:]).get("msg") == "process_completed":
                        completed += 1
                        if completed == MAX_UNREAD_EVENTS:
                            break
            assert client.post(url + "gradio_api/queue/join", json=join).status_code == 200, "read: it may ask again"


def test_the_unread_cap_holds_on_the_api_call_route_too():
    """`POST /gradio_api/call/<api>` with a session hash joins the queue in that session, just as
    `/gradio_api/queue/join` does; it must not be a way round the cap."""
    from ui.edge.tab_guard import MAX_UNREAD_EVENTS, TOO_MANY_UNREAD

    with page_without_worker("sec-unread-call") as (url, _client):
        session_hash = secrets.token_hex(8)
        call = {"data": [{"text": "hello", "files": []}, 1, None, "v1.made-up"], "session_hash": session_hash}
        with httpx.Client(timeout=60) as client:
            answers = [client.post(url + "gradio_api/call/chat", json=call) for _ in range(MAX_UNREAD_EVENTS)]
            assert [a.status_code for a in answers] == [200] * MAX_UNREAD_EVENTS
            refused = client.post(url + "gradio_api/call/chat", json=call)
            assert refused.status_code == 429 and refused.text == TOO_MANY_UNREAD
            # The page's own join route counts the same events.
            join = {"data": call["data"], "fn_index": fn_index(url, "chat"), "session_hash": session_hash,
                    "event_data": None}
            assert client.post(url + "gradio_api/queue/join", json=join).status_code == 429
            # Reading one event's result through its own stream frees a place.
            event_id = answers[0].json()["event_id"]
            with client.stream("GET", url + f"gradio_api/call/chat/{event_id}") as stream:
                events = [line for line in stream.iter_lines() if line.startswith("event:")]
            assert events and events[-1] in ("event: complete", "event: error"), events
            assert client.post(url + "gradio_api/call/chat", json=call).status_code == 200, "read: it may ask again"
