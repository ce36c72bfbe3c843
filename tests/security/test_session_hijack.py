"""Attack 2a: a stranger who knows a victim's Gradio session hash joins under it. The session hash is no
identity: the stranger sees none of the victim's conversation, cannot continue it, and cannot stop its answer or
reset its page with "New conversation".

(Gradio itself treats the session hash as a per-tab secret: its holder can read that tab's event stream and
cancel its events through Gradio's own routes. Owlet therefore never prints it or uses it as a label.)"""
from __future__ import annotations

import time

import httpx
import pytest

from tests.security.attack import LONG, ask, gradio_client
from tests.ui.page_client import bubble_text

pytestmark = pytest.mark.timeout(300)


def test_joining_under_a_victims_session_hash_gives_nothing(stack, r):
    victim = gradio_client(stack.url, "198.51.100.31")
    _box, _chat, status = ask(victim, "My secret holiday plan is Lisbon.").result(timeout=120)
    assert "First token" in status, status

    attacker = gradio_client(stack.url, "203.0.113.31")
    attacker.session_hash = victim.session_hash  # learned somehow: it is no longer printed anywhere
    _box, chat, status = attacker.predict({"text": "What did I say before?", "files": []}, 16,
                                          attacker.owlet_token, api_name="/chat")
    shown = " ".join(bubble_text(m) for m in chat or [])
    assert "Lisbon" not in shown and "holiday" not in shown, shown
    assert "belongs to someone else" in status, status

    running = ask(victim, "Tell me more, at length.", tokens=LONG)
    deadline = time.monotonic() + 60
    while not (running.outputs() and "Queued" not in running.outputs()[-1][2]):
        assert time.monotonic() < deadline, "the victim's answer never started"
        time.sleep(0.05)
    live = [k for k in r.scan_iter(match=f"{stack.prefix}job:*") if r.hget(k, "state") in (b"queued", b"started")]
    assert live, "the victim's answer is being generated"
    # The stranger presses Stop in the victim's session, with their own identity.
    response = httpx.post(stack.url + "gradio_api/run/stop", headers={"X-Forwarded-For": "203.0.113.31"},
                          json={"data": [None, attacker.owlet_token], "session_hash": victim.session_hash}, timeout=30)
    assert response.status_code == 200, response.text
    assert "Nothing to stop" in response.json()["data"][1], "the stranger is not told something was stopped"
    # ...and "New conversation" there: Gradio's `cancels=` would have ended every stream of that session hash.
    response = httpx.post(stack.url + "gradio_api/run/new_conversation",
                          headers={"X-Forwarded-For": "203.0.113.31"},
                          json={"data": [None, attacker.owlet_token], "session_hash": victim.session_hash}, timeout=30)
    assert response.status_code == 200, response.text
    assert "belongs to someone else" in str(response.json()["data"]), response.text
    time.sleep(1.5)
    assert all(r.hget(k, "state") != b"cancelled" for k in live), "the stranger's Stop cancelled nothing"
    assert not any(r.exists(f"{stack.prefix}cancel:{k.decode().rsplit(':', 1)[1]}") for k in live), \
        "not even a cancel flag"
    _box, chat, status = running.result(timeout=120)
    assert "First token" in status and not bubble_text(chat[-1]).endswith("*(stopped)*"), status


def test_the_victims_session_hash_is_not_an_identity_either(stack):
    victim = gradio_client(stack.url, "198.51.100.32")
    attacker = gradio_client(stack.url, "203.0.113.32")
    _box, _chat, status = attacker.predict({"text": "hi", "files": []}, 16, victim.session_hash, api_name="/chat")
    assert "could not tell who you are" in status, status
    assert attacker.predict(victim.session_hash, api_name="/identity") != victim.owlet_token
