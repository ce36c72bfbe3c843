"""A stranger who knows a victim's Gradio session hash uses it. From another network, every request
naming the hash is refused (ui/edge/tab_guard.py). From the victim's own network (behind one NAT, or the share link)
the hash is no identity either: the stranger sees none of the victim's conversation, cannot continue it, cannot stop
its answer or reset its page, and a cancel ends only the event it names.

(Gradio itself treats the session hash as a per-tab secret: its holder can read that tab's event stream through
Gradio's own routes. Owlet therefore never prints it or uses it as a label.)"""
from __future__ import annotations

import time
import types

import httpx
import pytest

from tests.security.attack import LONG, ask, gradio_client, http, identity
from tests.ui.page_client import bubble_text
from ui.shared import wording

pytestmark = pytest.mark.timeout(300)


def test_joining_under_a_victims_session_hash_gives_nothing(stack, r):
    victim = gradio_client(stack.url, "198.51.100.31")
    _box, _chat, status = ask(victim, "My secret holiday plan is Lisbon.").result(timeout=120)
    assert "Answered in" in status, status

    attacker = gradio_client(stack.url, "198.51.100.31")  # behind the victim's NAT: the hash's binding lets it in
    attacker.session_hash = victim.session_hash  # learned somehow: it is no longer printed anywhere
    _box, chat, status = attacker.predict({"text": "What did I say before?", "files": []}, 16,
                                          attacker.owlet_token, api_name="/chat")
    shown = " ".join(bubble_text(m) for m in chat) if isinstance(chat, list) else ""  # or left as it was
    assert "Lisbon" not in shown and "holiday" not in shown, shown
    assert "belongs to someone else" in status, status

    running = ask(victim, "Tell me more, at length.", tokens=LONG)
    _wait_until_answering(running)
    live = [k for k in r.scan_iter(match=f"{stack.prefix}job:*") if r.hget(k, "state") in (b"queued", b"started")]
    assert live, "the victim's answer is being generated"
    # The stranger presses Stop in the victim's session, with their own identity.
    response = httpx.post(stack.url + "gradio_api/run/stop", headers={"X-Forwarded-For": "198.51.100.31"},
                          json={"data": [None, attacker.owlet_token], "session_hash": victim.session_hash}, timeout=30)
    assert response.status_code == 200, response.text
    assert "Nothing to stop" in response.json()["data"][1], "the stranger is not told something was stopped"
    # ...and "New conversation" there: Gradio's `cancels=` would have ended every stream of that session hash.
    response = httpx.post(stack.url + "gradio_api/run/new_conversation",
                          headers={"X-Forwarded-For": "198.51.100.31"},
                          json={"data": [None, attacker.owlet_token], "session_hash": victim.session_hash}, timeout=30)
    assert response.status_code == 200, response.text
    assert "belongs to someone else" in str(response.json()["data"]), response.text
    time.sleep(1.5)
    assert all(r.hget(k, "state") != b"cancelled" for k in live), "the stranger's Stop cancelled nothing"
    assert not any(r.exists(f"{stack.prefix}cancel:{k.decode().rsplit(':', 1)[1]}") for k in live), \
        "not even a cancel flag"
    _box, chat, status = running.result(timeout=120)
    assert "Answered in" in status and not bubble_text(chat[-1]).endswith("*(stopped)*"), status


def test_the_victims_session_hash_is_not_an_identity_either(stack):
    victim = gradio_client(stack.url, "198.51.100.32")
    attacker = gradio_client(stack.url, "203.0.113.32")
    _box, _chat, status = attacker.predict({"text": "hi", "files": []}, 16, victim.session_hash, api_name="/chat")
    assert "could not tell who you are" in status, status
    assert attacker.predict(victim.session_hash, api_name="/identity") != victim.owlet_token


def _wait_until_answering(running) -> None:
    """Until the victim's answer has left the queue and is being written."""
    deadline = time.monotonic() + 60
    while not (running.outputs() and not running.outputs()[-1][2].startswith(wording.WAITING_STARTS)):
        assert time.monotonic() < deadline, "the victim's answer never started"
        time.sleep(0.05)


def _fn_indices(base: str) -> list[int]:
    """Every event id the page declares (an attacker tries them all)."""
    config = httpx.get(base + "config", timeout=30).json()
    return [dep["id"] for dep in config["dependencies"]]


def _conversations(r, prefix: str) -> set[str]:
    return {k.decode().rsplit(":", 1)[1] for k in r.scan_iter(match=f"{prefix}conv:*")}


def test_the_pages_private_events_under_a_victims_hash_change_and_tell_nothing(stack, r):
    """The page's own load and "remember" events (private, but Gradio runs them for anyone naming them)
    called under the victim's session hash: the stranger neither reads the victim's conversation id nor swaps
    their own identity or chat into the victim's tab."""
    before = _conversations(r, stack.prefix)
    victim = gradio_client(stack.url, "198.51.100.33")
    _box, _chat, status = ask(victim, "My locker code is 4711.").result(timeout=120)
    assert "Answered in" in status, status
    victims_chat = (_conversations(r, stack.prefix) - before).pop()

    attacker = gradio_client(stack.url, "198.51.100.33")  # the victim's network: the hash's binding lets it in
    _box, _chat, status = ask(attacker, "hello").result(timeout=120)
    attackers_chat = (_conversations(r, stack.prefix) - before - {victims_chat}).pop()
    headers = {"X-Forwarded-For": "198.51.100.33"}

    def run(api: str, data: list) -> str:
        response = httpx.post(f"{stack.url}gradio_api/run/{api}", headers=headers, timeout=30,
                              json={"data": data, "session_hash": victim.session_hash})
        assert response.status_code == 200, response.text
        return response.text

    # (The tab's state is an input too: the data hold a placeholder for it, which Gradio replaces.)
    for token in (None, attacker.owlet_token, victim.session_hash):
        assert victims_chat not in run("remember_conversation", [None, token]), "the victim's conversation leaked"
    # Reloading the victim's tab as the attacker, with the attacker's own chat, or with nothing.
    for data in ([attacker.owlet_token, {"conversation": attackers_chat}, None], [None, None, None]):
        assert "belongs to someone else" in run("on_load", data)
    # The victim's tab is untouched: its follow-up continues its own chat.
    _box, chat, status = ask(victim, "What is my locker code?").result(timeout=120)
    assert "Answered in" in status, status
    assert "4711" in bubble_text(chat[0]), "the follow-up is in the victim's own conversation"
    # And the attacker cannot ask in that tab either, even while it has no answer running.
    response = httpx.post(f"{stack.url}gradio_api/run/chat", headers=headers, timeout=60,
                          json={"data": [{"text": "mine now?", "files": []}, 16, None, attacker.owlet_token],
                                "session_hash": victim.session_hash})
    assert "belongs to someone else" in response.text, response.text
    assert _conversations(r, stack.prefix) - before == {victims_chat, attackers_chat}, "no chat was started"


def test_a_cancel_ends_only_the_event_it_names(stack, r):
    """Gradio's /cancel ends every running event of (session hash, event index) before it looks at the
    event id. Without one of the session's pending event ids it is refused; with one (an event of one's own, joined
    to the victim's session from the victim's network) it ends that event only, and the victim's answer runs to the
    end. With its own event id, a client still cancels its own answer."""
    victim = gradio_client(stack.url, "198.51.100.34")
    running = ask(victim, "Tell me a long story.", tokens=LONG)
    _wait_until_answering(running)
    chat_fn = _fn_index_of(stack.url, "chat")
    with http("127.0.0.1", "198.51.100.34", timeout=30) as attacker:
        token = identity(attacker, stack.url)
        for fn_index in _fn_indices(stack.url):
            for event_id in ("x", "", victim.session_hash):
                response = attacker.post(stack.url + "gradio_api/cancel", json={
                    "session_hash": victim.session_hash, "fn_index": fn_index, "event_id": event_id})
                assert response.status_code == 404, response.text
        assert attacker.post(stack.url + "gradio_api/cancel", content=b"not json").status_code == 404
        for _ in range(5):  # plant an event of one's own in the victim's session, and cancel it at once
            planted = attacker.post(stack.url + "gradio_api/queue/join", json={
                "data": [{"text": "hi", "files": []}, 16, None, token], "fn_index": chat_fn,
                "session_hash": victim.session_hash, "event_data": None, "trigger_id": None})
            assert planted.status_code == 200, planted.text
            response = attacker.post(stack.url + "gradio_api/cancel", json={
                "session_hash": victim.session_hash, "fn_index": chat_fn, "event_id": planted.json()["event_id"]})
            assert response.status_code in (200, 404), response.text  # 404: it had ended already
    _box, chat, status = running.result(timeout=180)
    assert "Answered in" in status and not bubble_text(chat[-1]).endswith("*(stopped)*"), status

    # The honest path: a client cancelling its own pending event (what the page's client sends).
    session_hash, chat_fn = "owlet-own-cancel-1", _fn_index_of(stack.url, "chat")
    with http("127.0.0.1", "198.51.100.35", timeout=120) as own:
        token = identity(own, stack.url)
        joined = own.post(stack.url + "gradio_api/queue/join", json={
            "data": [{"text": "Tell me a long story.", "files": []}, LONG, None, token], "fn_index": chat_fn,
            "session_hash": session_hash, "event_data": None, "trigger_id": None})
        assert joined.status_code == 200, joined.text
        event_id = joined.json()["event_id"]
        with own.stream("GET", stack.url + f"gradio_api/queue/data?session_hash={session_hash}") as events:
            cancelled = False
            for line in events.iter_lines():
                if not cancelled and '"process_generating"' in line:
                    response = httpx.post(stack.url + "gradio_api/cancel", timeout=30,
                                          headers={"X-Forwarded-For": "198.51.100.35"},
                                          json={"session_hash": session_hash, "fn_index": chat_fn,
                                                "event_id": event_id})
                    assert response.status_code == 200, response.text
                    cancelled = True
                if '"process_completed"' in line:
                    break
    assert cancelled, "the answer streamed, and its own event id cancelled it (the stream then completed)"


def _fn_index_of(base: str, api_name: str) -> int:
    config = httpx.get(base + "config", timeout=30).json()
    return next(dep["id"] for dep in config["dependencies"] if dep.get("api_name") == api_name)


def test_a_tab_holds_its_heartbeat_alone(stack):
    """When a heartbeat of a session closes, Gradio ends every pending event of that session (how a
    closed tab stops its answer). A second heartbeat beside the tab's own is refused, so nobody can open one and
    close it; once the tab's own is gone, the session can open one again."""
    session_hash = "owlet-heartbeat-owner-1"
    url = f"{stack.url}gradio_api/heartbeat/{session_hash}"
    with http("127.0.0.1", "198.51.100.36", timeout=30) as tab, tab.stream("GET", url) as own:
        assert own.status_code == 200
        with http("127.0.0.1", "198.51.100.36", timeout=30) as attacker:  # the same network
            second = attacker.get(url)
            assert second.status_code == 409, second.text
            assert "already open" in second.text
    deadline = time.monotonic() + 10
    with http("127.0.0.1", "198.51.100.36", timeout=30) as tab:
        while True:
            with tab.stream("GET", url) as again:
                if again.status_code == 200:
                    break
            assert time.monotonic() < deadline, "the session's heartbeat never came free"
            time.sleep(0.2)


def test_a_queue_stream_of_a_session_nobody_opened_is_a_plain_404(stack):
    """Gradio answered 200, then failed inside the stream with a logged traceback: about 9 ms of the event loop and
    6 KB of log a request, ten times a plain 404. The page answers 404 before Gradio runs; a session with an event
    still gets its stream."""
    with http("127.0.0.1", "203.0.113.37", timeout=30) as client:
        for _ in range(20):
            response = client.get(stack.url + "gradio_api/queue/data?session_hash=nobody-opened-this")
            assert response.status_code == 404 and response.text == "Session not found.", response.text
        assert client.get(stack.url + "gradio_api/queue/data").status_code == 404
        # the API's result stream of an event nobody started reads the id as a session: the same 404
        for route in ("call/chat", "call/v2/chat"):
            response = client.get(stack.url + f"gradio_api/{route}/nobody-started-this")
            assert response.status_code == 404 and response.text == "Session not found.", (route, response.text)
    victim = gradio_client(stack.url, "198.51.100.37")
    _box, _chat, status = ask(victim, "hello").result(timeout=120)  # gradio_client reads queue/data
    assert "Answered in" in status, status


def test_a_session_hash_is_bound_to_the_network_that_opened_it(stack, r):
    """From another network, the victim's session hash opens nothing: joining an event to it (with which
    Gradio's cancel ended the victim's answers), reading or closing its stream (closing one ended all its events),
    its API result stream, its heartbeat, a cancel, the page's private events. The victim's answer runs to the end."""
    victim = gradio_client(stack.url, "198.51.100.38")
    running = ask(victim, "Tell me a long story.", tokens=LONG)
    _wait_until_answering(running)
    victim_hash, chat_fn = victim.session_hash, _fn_index_of(stack.url, "chat")
    with http("127.0.0.1", "203.0.113.38", timeout=30) as attacker:
        token = identity(attacker, stack.url)
        own = "attacker-own-session-38"  # a session of the attacker's own, with an event in it
        joined = attacker.post(stack.url + "gradio_api/queue/join", json={
            "data": [{"text": "Tell me a long story.", "files": []}, LONG, None, token], "fn_index": chat_fn,
            "session_hash": own, "event_data": None, "trigger_id": None})
        assert joined.status_code == 200, joined.text
        refused = [
            attacker.post(stack.url + "gradio_api/queue/join", json={
                "data": [{"text": "hi", "files": []}, 16, None, token], "fn_index": chat_fn,
                "session_hash": victim_hash, "event_data": None, "trigger_id": None}),
            attacker.post(stack.url + "gradio_api/cancel", json={
                "session_hash": victim_hash, "fn_index": chat_fn, "event_id": "x"}),
            attacker.post(stack.url + "gradio_api/run/on_load", json={
                "data": [token, None, None], "session_hash": victim_hash}),
            attacker.get(stack.url + f"gradio_api/queue/data?session_hash={victim_hash}"),
            attacker.get(stack.url + f"gradio_api/call/chat/{victim_hash}"),
            attacker.get(stack.url + f"gradio_api/call/v2/chat/{victim_hash}"),  # Gradio's second result route
            attacker.get(stack.url + f"gradio_api/heartbeat/{victim_hash}"),
        ]
        for response in refused:
            assert response.status_code == 403, (response.request.url, response.status_code, response.text[:200])
            assert "opened from another network" in response.text
        # Two session hashes in one stream request, the attacker's first: the page would check that one, and
        # Gradio read the last.
        both = attacker.get(stack.url + f"gradio_api/queue/data?session_hash={own}&session_hash={victim_hash}")
        assert both.status_code == 404, both.text
    _box, chat, status = running.result(timeout=180)
    assert "Answered in" in status and not bubble_text(chat[-1]).endswith("*(stopped)*"), status


def test_the_bindings_cannot_be_grown_or_flushed_by_a_stranger():
    """A cancel or a heartbeat naming any string bound it (1 MB hashes grew the page by 145 MiB in 150 requests), and
    50,000 of them, about 90 s of requests from one address, pushed a victim's binding out so a stranger could take
    the hash. Only requests that open a session bind (they pass the new-tab budget and its hash format first),
    and a live session's binding is never the one forgotten."""
    from ui.edge.tab_guard import TabGuard

    queue = types.SimpleNamespace(pending_event_ids_session={"victim-tab": {"event-1"}}, event_ids_to_events={},
                                  pending_messages_per_session={})
    guard = TabGuard(app=None, queue=queue, remembered=3)

    def scope(address):
        return {"type": "http", "method": "POST", "path": "/gradio_api/queue/join", "headers": [],
                "client": (address, 1234), "query_string": b""}

    assert guard.bind("victim-tab", scope("198.51.100.1"))
    for i in range(1000):  # cancels and heartbeats bind nothing, whatever they name
        assert guard.bind(f"made-up-{i}" + "x" * 1000, scope("203.0.113.1"), new=False)
        assert guard.bind(f"made-up-{i}", scope("203.0.113.1"), new=False)
    assert list(guard._bound) == ["victim-tab"]
    assert guard.bind("x" * 65, scope("203.0.113.1")) and "x" * 65 not in guard._bound, "not a session hash"
    for i in range(50):  # sessions the stranger opens: the oldest idle ones go, the victim's live one stays
        assert guard.bind(f"opened-{i}", scope("203.0.113.1"))
    assert "victim-tab" in guard._bound and len(guard._bound) == 3
    assert not guard.bind("victim-tab", scope("203.0.113.1")), "still the victim's"


def test_an_api_call_without_a_session_hash_is_bound_to_its_caller(stack):
    """Gradio's plain HTTP flow (POST /call/<api>, then GET /call/<api>/<event id>) sends no session hash:
    Gradio makes the event id the session. It was never bound, so whoever learnt the id (a log, a shared curl
    command) read the answer, took its stream, or cancelled it, from any network. The returned id is bound to the
    caller before the caller receives it."""
    with http("127.0.0.1", "198.51.100.39", timeout=60) as owner, \
            http("127.0.0.1", "203.0.113.39", timeout=30) as stranger:
        token = identity(owner, stack.url)
        started = owner.post(stack.url + "gradio_api/call/chat",
                             json={"data": [{"text": "Tell me a long story.", "files": []}, LONG, token]})
        assert started.status_code == 200, started.text
        event_id = started.json()["event_id"]
        chat_fn = _fn_index_of(stack.url, "chat")
        refused = [stranger.get(stack.url + f"gradio_api/call/chat/{event_id}"),
                   stranger.get(stack.url + f"gradio_api/queue/data?session_hash={event_id}"),
                   stranger.post(stack.url + "gradio_api/cancel",
                                 json={"session_hash": event_id, "event_id": event_id, "fn_index": chat_fn})]
        for response in refused:  # the answer is still being written (LONG tokens)
            assert response.status_code == 403, (response.request.url, response.status_code, response.text)
        events = []
        with owner.stream("GET", stack.url + f"gradio_api/call/chat/{event_id}") as stream:
            assert stream.status_code == 200
            for line in stream.iter_lines():
                if line.startswith("event:"):
                    events.append(line.split(":", 1)[1].strip())
                    if events[-1] in ("complete", "error"):
                        break
        assert events[-1] == "complete", events
