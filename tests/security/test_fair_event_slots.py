"""Holding every one of Gradio's event slots from a few addresses, so a visitor's question waits behind the
crowd's resubmitted ones (ui.gradio_adapters.fair_event_slots).

With Gradio's own pick, sixteen addresses at their limit of four answer streams each held all 64 slots, and a
new visitor waited 51 s for a first token the worker produced in 0.05 s. Here the page has four slots and each
address may run two events."""
from __future__ import annotations

import time

import pytest

from tests.security.attack import Event, cancel_jobs, http, identity
from tests.security.pages import page_without_worker
from ui.gradio_adapters.fair_event_slots import TOO_MANY_WAITING, SlotUsage
from ui.shared import wording
from worker.queue.fairness import GROUP_USAGE_CAP_S, GROUP_USAGE_HALF_LIFE_S, GROUP_USAGE_WEIGHT

pytestmark = pytest.mark.timeout(180)

A1, A2, VISITOR = "203.0.113.31", "203.0.113.32", "198.51.100.33"
A3 = "203.0.113.34"


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
                    assert crowd[-1].status().startswith(wording.WAITING_STARTS), \
                        "the crowd holds the page's four slots"
            backlog = [question(url, address, tokens[address]) for address in (A1, A2) for _ in range(2)]
            visitor = question(url, VISITOR, tokens[VISITOR])
            assert not visitor.first.wait(2), "every slot is taken: the visitor waits"
            cancel_one_job_of(owlet, A1)  # one of A1's answers ends and frees a slot
            assert visitor.first.wait(15), "the freed slot went to the visitor, not to the older backlog"
            assert visitor.status().startswith(wording.WAITING_STARTS)
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


def test_an_address_whose_answer_just_streamed_waits_behind_a_visitor_among_equals():
    """A crowd address whose answer just ended runs nothing, like a visitor; it re-asks first, but the seconds its
    answer streamed set its new question back (x4, at most 30 s), so the next free slot goes to the visitor. (No
    worker here, so no answer streams: the page's usage is charged as an answer of A3's would have charged it.)"""
    pages = []
    with page_without_worker("fair-slots-usage", before_launch=pages.append, max_threads=4, address_max_events=2,
                             address_max_waiting_events=3, queue_poll_s=0.25) as (url, owlet):
        tokens = {}
        for address in (A1, A2, A3, VISITOR):
            with http(forwarded=address) as client:
                tokens[address] = identity(client, url)
        crowd = []
        try:
            pages[0]._queue.owlet_usage.charge(A3, 2.5)  # A3's last answer streamed for 2.5 s
            for address in (A1, A2):
                for _ in range(2):
                    crowd.append(question(url, address, tokens[address]))
                    assert crowd[-1].status().startswith(wording.WAITING_STARTS), \
                        "the crowd holds the page's four slots"
            again = question(url, A3, tokens[A3])  # A3 re-asks before the visitor arrives
            time.sleep(1.0)  # (each event posts from its own thread: let A3's reach the queue first)
            visitor = question(url, VISITOR, tokens[VISITOR])
            assert not visitor.first.wait(1) and not again.first.is_set(), "every slot is taken"
            cancel_one_job_of(owlet, A1)
            assert visitor.first.wait(15), "the freed slot went to the visitor, though A3 asked first"
            assert not again.first.wait(1), "A3's question still waits"
            cancel_one_job_of(owlet, A2)
            assert again.first.wait(15), "and takes the next slot"
        finally:
            cancel_jobs(owlet)
            for event in crowd:
                event.done.wait(30)


def test_slot_usage_decays_caps_and_forgets_idle_addresses():
    now = [1000.0]
    usage = SlotUsage(clock=lambda: now[0])
    assert usage.of("a") == 0.0 and usage.delay("a") == 0.0
    usage.charge("a", 2.0)
    assert usage.of("a") == 2.0 and usage.delay("a") == GROUP_USAGE_WEIGHT * 2.0
    now[0] += GROUP_USAGE_HALF_LIFE_S
    assert usage.of("a") == pytest.approx(1.0)
    usage.charge("a", 1.0)
    assert usage.of("a") == pytest.approx(2.0), "new time adds to the decayed old"
    usage.charge("b", 1000.0)
    assert usage.delay("b") == GROUP_USAGE_CAP_S, "a heavy user's wait stays bounded"
    assert usage.delay("b", longest_wait_s=3 * GROUP_USAGE_CAP_S) == 3 * GROUP_USAGE_CAP_S, \
        "past the cap, by the longest wait now: a crowd that waited out the cap stays behind a visitor"
    assert usage.delay("a", longest_wait_s=3 * GROUP_USAGE_CAP_S) == pytest.approx(GROUP_USAGE_WEIGHT * 2.0)
    for i in range(SlotUsage.MAX_ADDRESSES):
        usage.charge(f"idle-{i}", 0.1)
    assert usage.of("b") > 0 and usage.of("idle-0") == 0.0, "past the bound, addresses under a second are dropped"
    assert len(usage._held) < SlotUsage.MAX_ADDRESSES
