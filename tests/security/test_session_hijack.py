"""Attack 2a: a stranger who knows a victim's Gradio session hash joins under it. The session hash is no
identity: the stranger sees none of the victim's conversation, cannot continue it, and cannot stop it."""
from __future__ import annotations

import time

import pytest

from tests.security.attack import LONG, ask, gradio_client
from tests.ui.page_client import bubble_text

pytestmark = pytest.mark.timeout(300)


def test_joining_under_a_victims_session_hash_gives_nothing(stack):
    victim = gradio_client(stack.url, "198.51.100.31")
    first = ask(victim, "My secret holiday plan is Lisbon.")
    _box, _chat, status = first.result(timeout=120)
    assert "First token" in status, status
    running = ask(victim, "Tell me more, at length.", tokens=LONG)
    deadline = time.monotonic() + 60
    while not (running.outputs() and "Queued" not in running.outputs()[-1][2]):
        assert time.monotonic() < deadline, "the victim's answer never started"
        time.sleep(0.05)

    attacker = gradio_client(stack.url, "203.0.113.31")
    attacker.session_hash = victim.session_hash  # learned somehow: it is no longer printed anywhere
    _box, stop_status = attacker.predict(attacker.owlet_token, api_name="/stop")
    _box, chat, status = attacker.predict({"text": "What did I say before?", "files": []}, 16,
                                          attacker.owlet_token, api_name="/chat")
    shown = " ".join(bubble_text(m) for m in chat or [])
    assert "Lisbon" not in shown and "holiday" not in shown, shown
    assert "belongs to someone else" in status, status

    # The victim's answer was not stopped by the stranger's Stop: it runs on and ends on its own.
    time.sleep(1.0)
    assert not running.done() or "stopped" not in bubble_text(running.outputs()[-1][1][-1])
    victim.predict(victim.owlet_token, api_name="/stop")  # the owner can stop it
    _box, chat, status = running.result(timeout=60)
    assert status == "Stopped." and bubble_text(chat[-1]).endswith("*(stopped)*")


def test_the_victims_session_hash_is_not_an_identity_either(stack):
    victim = gradio_client(stack.url, "198.51.100.32")
    attacker = gradio_client(stack.url, "203.0.113.32")
    _box, _chat, status = attacker.predict({"text": "hi", "files": []}, 16, victim.session_hash, api_name="/chat")
    assert "could not tell who you are" in status, status
    assert attacker.predict(victim.session_hash, api_name="/identity") != victim.owlet_token
