"""Attack: hold every one of Gradio's event slots from a few addresses, so a visitor's question waits behind the
crowd's resubmitted ones (ui.fair_event_slots).

A hostile audit (2026-12-03): sixteen addresses at their limit of four answer streams each held all 64 slots, and a
new visitor waited 51 s for a first token the worker produced in 0.05 s. Here the page has four slots and each
address may run two events."""
from __future__ import annotations

import pytest

from tests.security.attack import Event, cancel_jobs, http, identity
from tests.security.pages import page_without_worker
from ui.fair_event_slots import TOO_MANY_WAITING

pytestmark = pytest.mark.timeout(180)

A1, A2, VISITOR = "203.0.113.31", "203.0.113.32", "198.51.100.33"


def question(url: str, address: str, token: str) -> Event:
    return Event(url, "chat", [{"text": "hello?", "files": []}, 16, token], forwarded=address)


def cancel_one_job_of(owlet, address: str) -> None:
    for key in owlet.r.scan_iter(match=owlet.keys.job("*"), count=1000):
        if owlet.r.hget(key, "group") == f"addr:{address}".encode():
            owlet.jobs.cancel(key.decode()[len(owlet.keys.job("")):])
            return
    raise AssertionError(f"no job of {address}")


def test_a_freed_slot_goes_to_the_visitor_not_to_the_crowds_backlog():
    with page_without_worker("fair-slots", max_threads=4, address_max_events=2, address_max_waiting_events=3,
                             queue_poll_s=0.25) as (url, owlet):
        tokens = {}
        for address in (A1, A2, VISITOR):  # before the slots are taken: identity is an event too
            with http(forwarded=address) as client:
                tokens[address] = identity(client, url)
        crowd = []
        try:
            for address in (A1, A2):
                for _ in range(2):
                    crowd.append(question(url, address, tokens[address]))
                    assert crowd[-1].status().startswith("Queued"), "the crowd holds the page's four slots"
            backlog = [question(url, address, tokens[address]) for address in (A1, A2) for _ in range(2)]
            visitor = question(url, VISITOR, tokens[VISITOR])
            assert not visitor.first.wait(2), "every slot is taken: the visitor waits"
            cancel_one_job_of(owlet, A1)  # one of A1's answers ends and frees a slot
            assert visitor.first.wait(15), "the freed slot went to the visitor, not to the older backlog"
            assert visitor.status().startswith("Queued")
            assert not any(event.first.is_set() for event in backlog), "the backlog still waits"
            with http(forwarded=A2) as client:  # A2 has two waiting: one more waits, the next is refused
                assert client.post(f"{url}gradio_api/call/chat",
                                   json={"data": [{"text": "x", "files": []}, 16, tokens[A2]]}).status_code == 200
                refused = client.post(f"{url}gradio_api/call/chat",
                                      json={"data": [{"text": "x", "files": []}, 16, tokens[A2]]})
            assert refused.status_code == 503 and TOO_MANY_WAITING in refused.text
        finally:
            cancel_jobs(owlet)
            for event in crowd:
                event.done.wait(30)
