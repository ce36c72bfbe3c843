"""API calls whose inputs Gradio cannot read (wrong types, wrong shapes, wrong counts). Each is refused before any
handler runs, admits nothing, and tells the caller what the endpoint takes (ui.gradio_adapters.malformed_inputs); the
page keeps serving."""
from __future__ import annotations

import pytest

from tests.security.attack import assert_can_still_ask, call, http, identity

pytestmark = pytest.mark.timeout(180)


def malformed_calls(token: str) -> list[tuple[str, list]]:
    return [
        ("chat", ["a plain string instead of the message object", 16, token]),
        ("chat", [{"text": 5, "files": []}, 16, token]),
        ("chat", [{"text": "hi", "files": ["not-an-upload"]}, 16, token]),
        ("chat", [{"text": "hi", "files": []}, "lots", token]),
        ("chat", [{"text": "hi", "files": []}]),  # too few inputs
        ("retry", ["many", token]),
    ]


def test_unreadable_inputs_get_a_sentence_naming_what_the_endpoint_takes(quiet_page):
    url, owlet = quiet_page
    with http(forwarded="203.0.113.60") as client:
        token = identity(client, url)
        for api, data in malformed_calls(token):
            with pytest.raises(RuntimeError, match="the page failed the event") as refused:
                call(client, url, api, data)
            message = str(refused.value)
            assert "This request could not be read" in message and f"/{api} takes" in message, (api, message)
        assert owlet.queue_stats()["queued"] == 0, "nothing was admitted"
        # Gradio's own readable refusals pass through as they were.
        with pytest.raises(RuntimeError, match="greater than maximum value"):
            call(client, url, "chat", [{"text": "hi", "files": []}, 10**9, token])
    assert_can_still_ask(url, owlet, token, forwarded="203.0.113.60")
