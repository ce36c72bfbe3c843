"""/retry and /edit called by API clients without the chat's event data, or with a malformed one.

The chat's buttons send ``{"index": N, "value": ...}``; gradio_client cannot send event data at all. Gradio's own
``RetryData``/``EditData`` parsed it before our handler and failed with its generic error. Now the caller gets a
sentence saying what to send, nothing stored changes, and the page keeps serving."""
from __future__ import annotations

import asyncio

import gradio as gr
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.identity import IdentityRequired
from ui.shared import wording

pytestmark = pytest.mark.timeout(120)


def test_api_retry_and_edit_without_event_data_get_a_sentence_and_the_page_keeps_serving():
    from gradio_client import Client

    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("retryapi"))
        with launched_page(config) as (url, _client):
            visitor = Client(url, verbose=False)
            token = visitor.predict(None, api_name="/identity")
            for endpoint in ("/retry", "/edit"):
                box, _chat, status = visitor.predict(16, token, api_name=endpoint)
                assert status == wording.NEEDS_MESSAGE_INDEX, endpoint
                assert box["interactive"] is True, "the box stays usable"
            # Unidentified callers are still turned away first, with the identity sentence.
            _box, _chat, status = visitor.predict(16, "forged", api_name="/retry")
            assert status == IdentityRequired.user_message
            # The page still answers other calls.
            assert visitor.predict(None, api_name="/identity")


@pytest.mark.parametrize("data, what", [
    (None, "no event data"),
    ({}, "no index"),
    ({"index": "2", "value": "x"}, "index as text"),
    ({"index": True, "value": "x"}, "index as bool"),
    ({"index": [], "value": "x"}, "empty index"),
    ({"index": 1.5, "value": "x"}, "fractional index"),
    ({"index": 0}, "edit without a value"),
])
def test_malformed_event_data_is_refused_and_nothing_is_truncated(data, what):
    from ui.chat.handlers import ChatHandlers
    from ui.chat.tab_state import new_tab_state
    from ui.ops.metrics import UIMetrics
    from worker.client import OwletClient
    from worker.config import Settings

    with running_redis() as url:
        prefix = unique_prefix("sec-redo")
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix=prefix))
        h = ChatHandlers(client, UIConfig(redis_url=url, key_prefix=prefix), UIMetrics())
        try:
            token = h.issuer.mint()
            user = f"anon:{h.issuer.verify(token)}"
            sub = client.submit(user, None, "short question")
            session = {**new_tab_state(), "conversation": sub.conv, "job": sub.job}
            event = gr.EventData(None, data)

            async def run(handler):
                return [u async for u in handler(16, session, token, event, gr.Request(session_hash="r"))]

            for name in ("retry", "edit"):
                if name == "retry" and what == "edit without a value":
                    continue  # a retry needs no value
                [(_box, _chat, status, _session)] = asyncio.run(run(getattr(h, name)))
                assert status == wording.NEEDS_MESSAGE_INDEX, (what, name)
            assert client.job_state(sub.job) == "queued", "the pending turn was not cancelled"
            assert len(client.history(user, sub.conv)) == 1, "nothing truncated"
        finally:
            h.decoder.close()
            client.close(purge=True)


def test_a_deeply_nested_edit_value_is_read_after_the_identity_check_and_never_recurses_without_end():
    """A 1.2 KB edit value of 500 nested lists made the page log a 145 KB traceback per call, before any identity
    or slot check."""
    from ui.chat.handlers import ChatHandlers
    from ui.chat.tab_state import new_tab_state
    from ui.ops.metrics import UIMetrics
    from worker.client import OwletClient
    from worker.config import Settings

    deep = "edited"
    for _ in range(500):
        deep = [deep]
    with running_redis() as url:
        prefix = unique_prefix("sec-deep-edit")
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix=prefix))
        h = ChatHandlers(client, UIConfig(redis_url=url, key_prefix=prefix), UIMetrics())
        try:
            event = gr.EventData(None, {"index": 0, "value": deep})

            async def run(token, session):
                return [u async for u in h.edit(16, session, token, event, gr.Request(session_hash="d"))]

            [(_box, _chat, status, _session)] = asyncio.run(run("forged", new_tab_state()))
            assert status == IdentityRequired.user_message, "the stranger is turned away before the value is read"
            [(_box, _chat, status, _session)] = asyncio.run(run(h.issuer.mint(), new_tab_state()))
            assert status == wording.NOTHING_TO_RETRY, "an identified caller gets a sentence, not a traceback"
        finally:
            h.decoder.close()
            client.close(purge=True)
