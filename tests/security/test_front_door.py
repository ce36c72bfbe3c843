"""Attack: front-door monopolisation. One address holding answer streams holds Gradio threads; now it may hold
at most ``address_max_events`` at once, the next is refused at once with a sentence, and a visitor at another
address gets in meanwhile (on a page with only 8 Gradio threads)."""
from __future__ import annotations

import time

import pytest

from tests.security.attack import LIMITS, Event, cancel_jobs, http, identity
from ui.shared import wording

pytestmark = pytest.mark.timeout(300)


def test_one_address_cannot_hold_the_front_door(quiet_page):
    url, owlet = quiet_page
    attacker = "203.0.113.71"
    with http(forwarded=attacker) as client:
        tokens = [identity(client, url) for _ in range(LIMITS["events"] + 3)]
    held = []
    try:
        for i, token in enumerate(tokens[:LIMITS["events"]]):
            held.append(Event(url, "chat", [{"text": f"hold {i}", "files": []}, 16, token], forwarded=attacker))
            assert held[-1].status().startswith(wording.WAITING_STARTS), held[-1].status()
        for token in tokens[LIMITS["events"]:]:
            t0 = time.monotonic()
            extra = Event(url, "chat", [{"text": "one more", "files": []}, 16, token], forwarded=attacker)
            held.append(extra)
            assert "from your network" in extra.status(timeout=30), extra.status()
            assert time.monotonic() - t0 < 10, "refused at once, not queued behind the attacker"
        with http(forwarded="198.51.100.71") as client:
            honest = Event(url, "chat", [{"text": "Is anyone there?", "files": []}, 16, identity(client, url)],
                           forwarded="198.51.100.71")
            held.append(honest)
            assert honest.status(timeout=30).startswith(wording.WAITING_STARTS), honest.status()
    finally:
        cancel_jobs(owlet)
        for e in held:
            e.done.wait(30)
