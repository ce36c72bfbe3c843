"""The page's handlers in-process over a real OwletClient and Redis: caps, busy, a silent worker, Stop
while queued, and retry/edit against the real stack's worker giving a consistent stored history."""
from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import gradio as gr
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import make_image
from ui.chat.handlers import ChatHandlers
from ui.chat.tab_state import new_tab_state
from ui.chat.view import message_text, render_history
from ui.config import UIConfig
from ui.ops.metrics import UIMetrics
from ui.shared import wording
from worker.client import OwletClient
from worker.config import Settings
from worker.errors import ConversationCleared
from worker.store.jobs import unencodable
from worker.store.keys import SlotsField

pytestmark = pytest.mark.timeout(180)


def make_handlers(redis_url: str, prefix: str, **settings) -> ChatHandlers:
    client = OwletClient(settings=Settings.from_env(redis_url=redis_url, key_prefix=prefix, **settings))
    config = UIConfig(redis_url=redis_url, key_prefix=prefix, stall_timeout_s=1.0, queue_poll_s=0.1,
                      max_new_tokens=24)
    return ChatHandlers(client, config, UIMetrics())


async def drain(agen) -> list:
    return [update async for update in agen]


def ask(handlers, text, session=None, browser=None, files=(), hash_="s"):
    browser = browser or handlers.issuer.mint()  # what the page's load event gives every browser
    return handlers.respond({"text": text, "files": list(files)}, 24, session or new_tab_state(), browser,
                            gr.Request(session_hash=hash_))


@pytest.fixture
def idle_handlers():
    """Handlers over a namespace where no worker consumes: jobs stay queued (or sit unconsumed in Celery)."""
    with running_redis() as redis_url:
        prefix = unique_prefix("uih")
        handlers = make_handlers(redis_url, prefix, user_queue_cap=1, global_queue_cap=2)
        yield handlers
        keys = list(handlers.client.r.scan_iter(match=prefix + "*", count=1000))
        if keys:
            handlers.client.r.delete(*keys)  # also ends follower threads still polling these streams
        handlers.client.close()


def test_user_cap_then_busy_then_stop_while_queued(idle_handlers):
    h = idle_handlers
    alice, bob, carol = h.issuer.mint(), h.issuer.mint(), h.issuer.mint()

    async def scenario():
        waiting = ask(h, "first question", browser=alice, hash_="a1")
        _box, chat, status, session = await waiting.__anext__()
        assert status.startswith(wording.WAITING_STARTS) and session["job"], status
        assert message_text(chat[-1]).startswith(wording.waiting("You are "))
        # Same person, a second conversation: the per-user cap (1 waiting job) refuses it, clearly.
        *_, (_b, chat2, status2, _s) = await drain(ask(h, "another chat", browser=alice, hash_="a2"))
        assert "questions waiting" in status2 and message_text(chat2[-1]).startswith(wording.WARNING_MARK)
        # Bob fills the global queue (cap 2); Carol is told the service is busy.
        bob_waiting = ask(h, "bob asks", browser=bob, hash_="b1")
        _b, _c, bob_status, bob_session = await bob_waiting.__anext__()
        *_, (_b, _c, status3, _s) = await drain(ask(h, "carol asks", browser=carol, hash_="c1"))
        assert "busy" in status3.lower(), status3
        # Stop while queued: the job ends at once and the stream finishes with "Stopped."
        stop_box, _stop_status, _ = h.stop(session, alice, gr.Request(session_hash="a1"))
        assert stop_box["interactive"] is True, "Stop opens the box at once"
        *_, (box, chat4, status4, session4) = await drain(waiting)
        assert status4 == wording.STOPPED and message_text(chat4[-1]).endswith("*(stopped)*")
        assert session4["job"] is None
        assert "value" not in box and "interactive" not in box, "the stopped stream leaves a new draft alone"
        h.stop(bob_session, bob, gr.Request(session_hash="b1"))
        await drain(bob_waiting)

    asyncio.run(scenario())
    assert h.client.health()["queued"] == 0
    text = h.metrics.render().decode()
    assert 'owlet_ui_errors_total{kind="user_cap"} 1.0' in text and 'owlet_ui_errors_total{kind="busy"} 1.0' in text


def test_a_reloaded_page_waits_for_its_address_slot_instead_of_being_refused(idle_handlers):
    """Four people behind one address with answers open; one reloads. The old tab's stream held its slot until
    Gradio noticed it had closed, so the reloaded page was told "Too many answers are open" about the answer it
    was following, and showed it only after another reload."""
    h = idle_handlers
    alice = h.issuer.mint()

    async def scenario():
        asking = ask(h, "first question", browser=alice, hash_="tab")
        _box, _chat, status, session = await asking.__anext__()
        assert status.startswith(wording.WAITING_STARTS), status
        address = h.guard.caller(gr.Request(session_hash="tab"), alice).address
        for _ in range(h.config.address_max_events - 1):  # the other people's answers
            h.event_slots.acquire(address)
        # The reload: the old tab's stream still holds the fourth slot.
        _id, _chat, _status, reloaded, _remember = h.on_load(alice, {"conversation": session["conversation"]}, None,
                                                             gr.Request(session_hash="reloaded"))
        assert reloaded["job"] == session["job"]
        following = h.resume(reloaded, alice, gr.Request(session_hash="reloaded"))
        first = asyncio.ensure_future(following.__anext__())
        await asyncio.sleep(1.0)
        assert not first.done(), "it waits for the slot (no refusal)"
        await asking.aclose()  # Gradio notices the old tab has gone: its slot comes free
        _box, chat, status, _session = await asyncio.wait_for(first, timeout=5)
        assert status.startswith(wording.WAITING_STARTS), status
        assert message_text(chat[-1]).startswith(wording.waiting("You are ")), status
        await following.aclose()
        await asyncio.sleep(0.2)  # the inner generators are closed by the loop's finaliser, a step later

        # A new question from an address whose slots are all held is still refused at once.
        h.event_slots.acquire(address)
        assert h.event_slots.held(address) == h.config.address_max_events
        started = time.monotonic()
        *_, (_b, _c, refused, _s) = await drain(ask(h, "one more", browser=h.issuer.mint(), hash_="other"))
        assert "Too many answers are open" in refused and time.monotonic() - started < 1.0

    asyncio.run(scenario())


def test_the_queued_line_says_when_no_worker_is_running_instead_of_an_eta(idle_handlers):
    """With the worker dead, every waiting user read that they were next in line, "about 1 s", for as long as the
    restart took (9-37 s)."""
    from worker.heartbeat import Heartbeat, publish

    h = idle_handlers

    async def scenario():
        asking = ask(h, "anyone there?", hash_="lonely")
        statuses = []
        async def next_status():
            _box, _chat, status, _session = await asyncio.wait_for(asking.__anext__(), timeout=10)
            statuses.append(status)
            return status
        while wording.NO_WORKER not in await next_status():
            pass
        # A worker comes back (alive, with no free slot yet, so the question stays queued).
        publish(h.client.r, h.client.keys, Heartbeat(worker="back@test", capacity=0), ttl_s=60)
        while wording.NO_WORKER in await next_status():
            pass
        await asking.aclose()
        return statuses

    statuses = asyncio.run(scenario())
    assert statuses[-1].startswith("You are next in line") and wording.NO_WORKER not in statuses[-1], statuses
    assert not any("about" in s for s in statuses if wording.NO_WORKER in s), "no ETA while nothing can start it"


def test_retry_of_a_refused_question_says_it_was_never_sent(idle_handlers, tmp_path):
    """The chat shows a refused question with its reason under it; its retry button said "Only your own messages
    can be retried or edited", about the user's own message."""
    h = idle_handlers
    alice = h.issuer.mint()
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(make_image(tmp_path / "whole.png").read_bytes()[:-60])

    async def scenario():
        asking = ask(h, "first question", browser=alice, hash_="t")
        _box, _chat, _status, session = await asking.__anext__()
        h.stop(session, alice, gr.Request(session_hash="t"))
        *_, (_b, _c, _s, session) = await drain(asking)
        *_, (_b, chat, status, session) = await drain(ask(h, "and this?", session=session, browser=alice,
                                                          files=[str(damaged)], hash_="t"))
        assert status.startswith("The image file is damaged"), status
        assert message_text(chat[-1]).startswith(wording.WARNING_MARK)
        retried = h.retry(24, session, alice, gr.EventData(None, {"index": len(chat) - 1, "value": "x"}),
                          gr.Request(session_hash="t"))
        [(_box, shown, said, _session)] = await drain(retried)
        return shown, said

    shown, said = asyncio.run(scenario())
    assert said == wording.NEVER_SENT, said
    assert shown == gr.skip(), "the refusal and its reason stay in the chat"


def test_a_silent_worker_is_reported_and_the_job_cancelled(idle_handlers):
    from worker.heartbeat import Heartbeat, publish

    h = idle_handlers
    # A heartbeat with free capacity but no consumer: the job is dispatched and then nothing ever arrives.
    publish(h.client.r, h.client.keys, Heartbeat(worker="ghost@test", capacity=2), ttl_s=60)
    start = time.monotonic()
    browser = h.issuer.mint()
    updates = asyncio.run(drain(ask(h, "hello?", browser=browser)))
    _box, chat, status, session = updates[-1]
    job = next(u[3]["job"] for u in updates if u[3] is not gr.skip() and isinstance(u[3], dict) and u[3].get("job"))
    assert status == wording.warning(wording.WORKER_LOST)
    assert message_text(chat[-1]) == wording.warning(wording.WORKER_LOST)
    assert time.monotonic() - start < 10
    assert session["job"] is None
    # ...and cancelled, not only reported: it held a dispatch slot, and its conversation read "still answering".
    # Dispatched but never started: it ends at once (the worker that receives it later cannot claim it).
    assert h.client.job_state(job) == "cancelled"
    assert h.client.r.zcard(h.client.keys.inflight) == 0, "its dispatch slot is free again"
    assert 'owlet_ui_errors_total{kind="worker_lost"} 1.0' in h.metrics.render().decode()


def test_empty_input_and_too_many_images_are_refused_without_touching_redis(idle_handlers, tmp_path):
    h = idle_handlers
    before = list(h.client.r.scan_iter(match=h.client.settings.key_prefix + "*"))
    [(_b, chat, status, _s)] = asyncio.run(drain(ask(h, "   ")))
    assert status == wording.EMPTY_MESSAGE and chat is not None
    two = [str(make_image(tmp_path / "a.png")), str(make_image(tmp_path / "b.png"))]
    [(_b, _c, status, _s)] = asyncio.run(drain(ask(h, "compare", files=two)))
    assert status == wording.ONE_IMAGE_ONLY
    assert list(h.client.r.scan_iter(match=h.client.settings.key_prefix + "*")) == before


def test_a_question_with_an_unpaired_surrogate_is_refused_in_a_sentence_before_anything_echoes_it(idle_handlers):
    """Half of a UTF-16 pair (a broken paste; a hand-made request's "\\ud800") has no UTF-8 form: Gradio could not
    send it back to the browser (the stream ended mid-reply, the page stuck on "Sending"), nor Redis store it. The
    page refuses it with its own sentence, as it refuses an over-long question, and touches nothing."""
    h = idle_handlers
    before = list(h.client.r.scan_iter(match=h.client.settings.key_prefix + "*"))
    [(_b, chat, status, _s)] = asyncio.run(drain(ask(h, "what shape is it? \ud800")))
    assert status == unencodable("Your question", "what shape is it? \ud800")
    assert status.startswith("Your question holds a character that is not text (an unpaired surrogate, U+D800, at "
                             "character 19)"), status
    assert chat is gr.skip() or chat == gr.skip(), "nothing of it is echoed"
    assert list(h.client.r.scan_iter(match=h.client.settings.key_prefix + "*")) == before


def test_retry_and_edit_keep_the_stored_history_consistent(stack, tmp_path):
    h = make_handlers(stack.redis_url, stack.prefix)
    browser, req = h.issuer.mint(), gr.Request(session_hash="retry-edit")
    image = str(make_image(tmp_path / "green.png", (20, 200, 20)))

    async def scenario():
        *_, (_b, _c, status, session) = await drain(ask(h, "first question", browser=browser, files=[image]))
        assert "Answered in" in status, status
        *_, (_b, chat, status, session) = await drain(ask(h, "second question", session, browser))
        assert len(chat) == 4

        retry = gr.RetryData(None, {"index": 2, "value": "second question"})
        *_, (_b, chat, status, session) = await drain(h.retry(24, session, browser, retry, req))
        assert "Answered in" in status, status
        turns = h.client.history(f"anon:{h.issuer.verify(browser)}", session["conversation"])
        assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant"]
        assert turns[2]["text"] == "second question"
        assert chat == render_history(turns, session["images"]), "the page shows exactly the stored history"

        edit = gr.EditData(None, {"index": 0, "value": [{"type": "text", "text": "edited first"}],
                                  "previous_value": "first question"})
        *_, (_b, chat, status, session) = await drain(h.edit(24, session, browser, edit, req))
        turns = h.client.history(f"anon:{h.issuer.verify(browser)}", session["conversation"])
        assert [(t["role"], t["text"]) for t in turns][:1] == [("user", "edited first")] and len(turns) == 2
        assert turns[0]["image_sha"], "editing the text keeps the image of that turn"
        assert chat == render_history(turns, session["images"])
        assert chat[0]["content"][0]["file"]["path"] == image

    try:
        asyncio.run(scenario())
    finally:
        h.client.close()


def test_a_refused_picture_stays_in_the_chat_until_an_edit_asks_again_before_it(stack, tmp_path):
    """The reason a picture was refused stayed in the chat only until the next turn re-rendered the stored history.
    The tab keeps it where it was asked; a retry of it says it was never sent, and an edit of an earlier question
    takes it away with the turns after that question."""
    h = make_handlers(stack.redis_url, stack.prefix)
    browser, req = h.issuer.mint(), gr.Request(session_hash="refusals")
    image, notes = str(make_image(tmp_path / "green.png", (20, 200, 20))), tmp_path / "notes.png"
    notes.write_text("not a picture\n" * 20)

    async def scenario():
        *_, (_b, _c, status, session) = await drain(ask(h, "first question", browser=browser, files=[image]))
        assert "Answered in" in status, status
        *_, (_b, chat, status, session) = await drain(ask(h, "and this one?", session, browser, files=[str(notes)]))
        assert status.startswith("This file is not an image") and len(chat) == 4
        *_, (_b, chat, status, session) = await drain(ask(h, "second question", session, browser))
        assert "Answered in" in status, status
        shown = [message_text(m) for m in chat]
        assert len(shown) == 6 and shown[2] == "and this one?" and shown[4] == "second question", shown
        assert shown[3].startswith(wording.warning("This file is not an image")), "the refusal stays where it was"

        retry = gr.RetryData(None, {"index": 2, "value": "and this one?"})
        *_, (_b, _c, status, session) = await drain(h.retry(24, session, browser, retry, req))
        assert status == wording.NEVER_SENT

        edit = gr.EditData(None, {"index": 0, "value": [{"type": "text", "text": "edited first"}],
                                  "previous_value": "first question"})
        *_, (_b, chat, status, session) = await drain(h.edit(24, session, browser, edit, req))
        assert "Answered in" in status and len(chat) == 2 and session["refusals"] == [], status

    try:
        asyncio.run(scenario())
    finally:
        h.client.close()


def test_redis_down_is_a_clear_message_not_a_traceback():
    from tests.ui.stack import free_port

    h = make_handlers(f"redis://127.0.0.1:{free_port()}/0", "owlet-nowhere:")
    *_, (box, chat, status, session) = asyncio.run(drain(ask(h, "anyone there?", browser=h.issuer.mint())))
    assert status == wording.SERVICE_DOWN and message_text(chat[-1]) == wording.warning(wording.SERVICE_DOWN)
    assert box["interactive"] is True and session["job"] is None
    h.client.close()


def test_queue_eta_is_the_workers_mean_service_time_over_live_capacity(idle_handlers):
    from worker.heartbeat import Heartbeat, publish

    client = idle_handlers.client
    assert client.eta_s(3) is None, "no service time measured yet: no estimate"
    client.r.hset(client.keys.slots, SlotsField.service_s, 8.0)  # what FINISH keeps: the workers' mean service time
    assert client.eta_s(3) is None, "no live worker: no estimate"
    publish(client.r, client.keys, Heartbeat(worker="a@test", capacity=2), ttl_s=60)
    publish(client.r, client.keys, Heartbeat(worker="b@test", capacity=3), ttl_s=60)
    assert client.eta_s(10) == pytest.approx(10 * 8.0 / 5)
    client.r.hset(client.keys.slots, SlotsField.service_s, 10.0)
    assert client.eta_s(5) == pytest.approx(10.0)
    assert client.eta_s(None) is None


def test_a_job_behind_a_busy_worker_shows_its_position_and_an_eta(idle_handlers, monkeypatch):
    from worker.heartbeat import Heartbeat, publish

    h = idle_handlers
    publish(h.client.r, h.client.keys, Heartbeat(worker="busy@test", capacity=1), ttl_s=60)
    h.client.r.hset(h.client.keys.slots, SlotsField.service_s, 8.0)
    h.config = replace(h.config, stall_timeout_s=30.0)  # the dispatched job is silent on purpose

    async def scenario():
        first = ask(h, "takes the only slot", browser=h.issuer.mint(), hash_="x1")
        await first.__anext__()
        second = ask(h, "waits behind it", browser=h.issuer.mint(), hash_="x2")
        statuses = []
        async for _box, _chat, status, session in second:
            statuses.append(status)
            if "about" in status:
                break
        assert any(s.startswith("You are next in line, about 8 s") for s in statuses), statuses
        await second.aclose()  # leaving the stream cancels the waiting job, unless a page follows it again soon
        await first.aclose()
        await asyncio.sleep(0.5)  # the grace a reloaded page gets (shortened here)

    import ui.chat.streaming
    monkeypatch.setattr(ui.chat.streaming, "RELOAD_GRACE_S", 0.1)
    asyncio.run(scenario())
    assert h.client.health()["queued"] == 0, "closing the page's streams cancelled both jobs"


async def stopped_first_question(h, browser: str) -> dict:
    """A first question asked in tab "tab" and stopped at once: the tab's state once its answer has ended (its
    conversation holds the question, and no first answer is being made)."""
    asking = ask(h, "what is in this picture?", browser=browser, hash_="tab")
    _box, _chat, _status, session = await asking.__anext__()
    h.stop(session, browser, gr.Request(session_hash="tab"))
    *_, (_b, _c, _s, session) = await drain(asking)
    return session


def test_a_conversation_that_gave_way_says_so_when_reopened_and_the_next_question_starts_afresh(idle_handlers):
    """The service-wide history budget cleared a visitor's conversation (the least recently used, whole). Reopened
    (a reload), the page says why it is empty and forgets it; a tab still showing it is told the same when it asks
    on, and its next question starts a new conversation."""
    h = idle_handlers
    alice = h.issuer.mint()
    cleared = ConversationCleared.user_message

    async def scenario():
        session = await stopped_first_question(h, alice)
        conv = session["conversation"]
        assert h.client.jobs.make_room() > 0  # MAKE_ROOM, as a full Redis has it run: the idle conversation goes
        assert not h.client.r.exists(h.client.keys.conversation(conv), h.client.keys.turns(conv))

        _id, chat, status, tab, remember = h.on_load(alice, {"conversation": conv}, None,
                                                     gr.Request(session_hash="reloaded"))
        assert chat == [] and status == cleared and tab["conversation"] is None
        assert remember["conversation"] is None, "the browser forgets it"
        # Someone else naming it learns nothing.
        _id, _chat, status, _tab, _remember = h.on_load(h.issuer.mint(), {"conversation": conv}, None,
                                                        gr.Request(session_hash="stranger"))
        assert status == ""

        *_, (_b, chat, status, tab) = await drain(ask(h, "and the colours?", session=session, browser=alice,
                                                      hash_="tab"))
        assert status == cleared and wording.WARNING_MARK in message_text(chat[-1])
        assert tab["conversation"] is None, "the next question starts a new conversation"
        again = ask(h, "what is in this one?", session=tab, browser=alice, hash_="tab")
        _box, _chat, status, tab = await again.__anext__()
        assert status.startswith(wording.WAITING_STARTS) and tab["conversation"] not in (None, conv)
        h.stop(tab, alice, gr.Request(session_hash="tab"))
        await drain(again)

    asyncio.run(scenario())


def test_a_reload_just_after_a_first_answer_reopens_the_chat_the_browser_has_not_remembered_yet(idle_handlers):
    """The browser remembers a chat one step after its answer's last update (an event of its own): a page reloaded
    in between opened an empty chat, and the conversation was out of the page's reach. Now the page finds on the
    server the chat made after the browser last remembered one; a chat left with "New conversation" stays closed."""
    h = idle_handlers
    alice = h.issuer.mint()

    async def scenario():
        before = time.time()
        session = await stopped_first_question(h, alice)  # its answer has ended: not a first answer being made
        conv = session["conversation"]
        assert h.client.first_answer(h.guard.caller(gr.Request(session_hash="tab"), alice).user) is None

        # a first visit: the browser never remembered a chat
        _id, chat, status, tab, remember = h.on_load(alice, None, None, gr.Request(session_hash="r1"))
        assert tab["conversation"] == conv and status == wording.RESTORED
        assert "what is in this picture?" in message_text(chat[0])
        assert remember["conversation"] == conv and remember["at"] >= before, "and the browser remembers it now"
        # the browser remembered another chat (here a new one) before this one was made
        _id, _chat, _status, tab, _r = h.on_load(alice, {"conversation": None, "at": before - 1}, None,
                                                 gr.Request(session_hash="r2"))
        assert tab["conversation"] == conv

        # "New conversation" after it: what the browser then keeps is newer than the chat, which stays closed
        _box, _chat, _status, fresh = h.new_conversation(tab, alice, gr.Request(session_hash="r2"))
        kept = h.remember_conversation(fresh, alice, gr.Request(session_hash="r2"))
        assert kept["conversation"] is None and kept["at"] >= before
        _id, chat, status, tab, remember = h.on_load(alice, kept, None, gr.Request(session_hash="r3"))
        assert chat == [] and tab["conversation"] is None and status == ""
        # what an earlier version kept (no time): only a first answer being made is reopened, as before
        _id, chat, _status, tab, _r = h.on_load(alice, {"conversation": None}, None, gr.Request(session_hash="r4"))
        assert chat == [] and tab["conversation"] is None
        # nobody else is shown it, whatever time their browser claims
        _id, chat, _status, tab, _r = h.on_load(h.issuer.mint(), {"conversation": None, "at": 0}, None,
                                                gr.Request(session_hash="r5"))
        assert chat == [] and tab["conversation"] is None

    asyncio.run(scenario())


def test_a_reload_just_after_new_conversation_does_not_reopen_the_chat_left(idle_handlers):
    """The browser remembers leaving a chat with "New conversation" one step after the chat was cleared (an event of
    its own): a page reloaded in between found the left chat still kept, and reopened it. Now the server records the
    leaving, and a chat left after the browser last remembered stays closed; one remembered again later (another tab
    of the browser went on with it) reopens."""
    h = idle_handlers
    alice = h.issuer.mint()

    async def scenario():
        before = time.time()
        session = await stopped_first_question(h, alice)
        conv = session["conversation"]
        kept = h.remember_conversation(session, alice, gr.Request(session_hash="tab"))
        assert kept["conversation"] == conv
        _id, _chat, status, tab, _r = h.on_load(alice, kept, None, gr.Request(session_hash="r1"))
        assert tab["conversation"] == conv and status == wording.RESTORED, "kept and not left: reopened"

        h.new_conversation(tab, alice, gr.Request(session_hash="r1"))  # its remembering has not come back yet
        _id, chat, status, tab, remember = h.on_load(alice, kept, None, gr.Request(session_hash="r2"))
        assert chat == [] and tab["conversation"] is None and status == ""
        assert remember["conversation"] is None, "and the browser is told to forget it"
        # found on the server as the newest chat made after the browser last remembered, it stays closed too
        _id, chat, _status, tab, _r = h.on_load(alice, {"conversation": None, "at": before - 1}, None,
                                                gr.Request(session_hash="r3"))
        assert chat == [] and tab["conversation"] is None
        # kept by an earlier version (no time): a chat left stays closed
        _id, chat, _status, tab, _r = h.on_load(alice, {"conversation": conv}, None, gr.Request(session_hash="r4"))
        assert chat == [] and tab["conversation"] is None

        # another tab of the browser went on with the chat, and the browser remembered it after the leaving
        again = {"conversation": conv, "at": time.time() + 0.01}
        _id, _chat, status, tab, _r = h.on_load(alice, again, None, gr.Request(session_hash="r5"))
        assert tab["conversation"] == conv and status == wording.RESTORED

        # nobody else can record leaving alice's chat
        mallory = h.guard.caller(gr.Request(session_hash="m"), h.issuer.mint()).user
        assert h.client.leave(mallory, conv, time.time() + 100) is False
        _id, _chat, _status, tab, _r = h.on_load(alice, again, None, gr.Request(session_hash="r6"))
        assert tab["conversation"] == conv

    asyncio.run(scenario())
