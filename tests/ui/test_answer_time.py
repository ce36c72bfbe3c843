"""The page charges each answer's streaming time (first token to end, not its wait in the queue) to the asking address:
what the event-slot picker weighs (ui/gradio_adapters/fair_event_slots.py). A real worker answers; the page runs in this
process so its usage can be read."""
from __future__ import annotations

import time

import pytest

from tests.security.attack import chat, http, identity
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig

pytestmark = pytest.mark.timeout(180)


def _conversation_keys(owlet) -> set[bytes]:
    return set(owlet.r.scan_iter(match=owlet.keys.prefix + "conv:*", count=1000))


def test_an_answered_question_charges_its_streaming_time_to_the_address(stack):
    pages = []
    config = UIConfig(port=free_port(), redis_url=stack.redis_url, key_prefix=stack.prefix, queue_poll_s=0.5)
    with launched_page(config, before_launch=pages.append, purge=False) as (url, owlet):
        usage = pages[0]._queue.owlet_usage
        before = _conversation_keys(owlet)
        try:
            with http() as client:
                token = identity(client, url)
                assert usage.of("127.0.0.1") == 0.0, "asking for an identity streams no answer"
                started = time.monotonic()
                payloads = chat(client, url, token, "What colour is it?", tokens=24)
                took = time.monotonic() - started
        finally:  # the stack is shared: leave no conversation of this test's behind (tests count them)
            made = _conversation_keys(owlet) - before
            if made:
                owlet.r.delete(*made)
        assert payloads[-1][1][-1]["content"], "the worker answered"
        charged = usage.of("127.0.0.1")
        assert 0.0 < charged <= took, f"charged {charged:.3f} s of a {took:.3f} s question"
