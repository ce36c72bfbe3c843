"""The cheap-streaming parts of the page: the fair update pacer, and the stream hub over real Redis (one
reader for many streams, events in order, terminal events end a subscription, a vanished stream ends too)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from types import SimpleNamespace

import pytest

from tests.redis_server import OwnedRedis, running_redis, unique_prefix
from ui.chat.pacing import UpdatePacer, watch_loop_lag
from ui.chat.stream_hub import StreamHub
from ui.shared import wording
from worker.client import OwletClient
from worker.config import Settings
from worker.errors import UnknownJob
from worker.store.streams import encode

pytestmark = pytest.mark.timeout(60)


def test_pacer_shares_the_page_budget_fairly_within_bounds():
    pacer = UpdatePacer(max_total_per_s=400, max_per_stream_per_s=20, min_per_stream_per_s=4)
    assert pacer.interval_s() == pytest.approx(1 / 20)  # alone: full speed
    for _ in range(64):
        pacer.join()
    assert pacer.interval_s() == pytest.approx(64 / 400)  # 6.25 updates/s each, 400/s in all
    for _ in range(200 - 64):
        pacer.join()
    assert pacer.interval_s() == pytest.approx(1 / 4)  # never slower than the floor
    for _ in range(300):
        pacer.leave()
    assert pacer.live == 0 and pacer.interval_s() == pytest.approx(1 / 20)


def test_pacer_budget_follows_event_loop_lag_within_its_bounds():
    """A lagging loop lowers the page budget (each stream updates less often, never below the floor); a
    punctual one brings it back to the configured cap, never above."""
    pacer = UpdatePacer(max_total_per_s=400, max_per_stream_per_s=20, min_per_stream_per_s=4)
    for _ in range(32):
        pacer.join()
    for _ in range(3):
        pacer.observe_lag(0.2)
    assert pacer.budget < 400 * 0.6 and 1 / pacer.interval_s() < 400 / 32
    for _ in range(50):
        pacer.observe_lag(0.5)
    assert pacer.budget == pytest.approx(32 * 4) and pacer.interval_s() == pytest.approx(1 / 4)  # the floor
    pacer.observe_lag(0.015)  # in between: no change
    assert pacer.budget == pytest.approx(32 * 4)
    for _ in range(50):
        pacer.observe_lag(0.001)
    assert pacer.budget == 400 and pacer.interval_s() == pytest.approx(1 / 12.5)


def test_loop_lag_watcher_feeds_the_pacer():
    """The watcher measures a real loop: a callback that blocks it for 0.3 s shows up as lag."""
    async def scenario():
        pacer = UpdatePacer(max_total_per_s=400, max_per_stream_per_s=20, min_per_stream_per_s=4)
        lags = []
        observe = pacer.observe_lag
        pacer.observe_lag = lambda lag: (lags.append(lag), observe(lag))
        watch = asyncio.get_running_loop().create_task(watch_loop_lag(pacer, period_s=0.01))
        await asyncio.sleep(0.05)
        time.sleep(0.3)  # the loop is stuck: the sleeper wakes late
        await asyncio.sleep(0.05)
        watch.cancel()
        return lags
    lags = asyncio.run(scenario())
    assert len(lags) >= 3 and max(lags) >= 0.25, lags


@pytest.fixture
def client():
    with running_redis() as url:
        c = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix=unique_prefix("hub")))
        yield c
        c.close(purge=True)


def test_every_follower_of_one_answer_gets_all_of_it(client):
    """A reloaded page, or a second tab, follows the same answer as the first tab: each gets every event, from the
    start, and ends with the answer. One subscription per stream let the newest take it from the others, which
    then waited two minutes and told their user the worker was lost."""
    async def scenario():
        hub = StreamHub(client, tick_s=0.01, block_ms=50, idle_check_s=0.3)
        got: dict[str, list] = {"first": [], "reloaded": [], "late": []}
        ended: dict[str, asyncio.Event] = {name: asyncio.Event() for name in got}

        def deliverer(name):
            def deliver(events, is_end):
                got[name].extend(e.get("text") for e in events)
                if is_end:
                    ended[name].set()
            return deliver

        key = client.keys.stream("shared")
        hub.subscribe("shared", deliverer("first"))
        for i in range(10):
            client.r.xadd(key, encode("token", text=str(i)))
        await asyncio.sleep(0.2)
        hub.subscribe("shared", deliverer("reloaded"))  # from the start, while "first" is ahead
        for i in range(10, 20):
            client.r.xadd(key, encode("token", text=str(i)))
        await asyncio.sleep(0.2)
        client.r.xadd(key, encode("done", text="end"))
        hub.subscribe("shared", deliverer("late"))  # after the end: replays it all
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ended.values())), timeout=10)
        assert hub.live == 0, "ended followers are dropped"
        hub.close()
        return got

    got = asyncio.run(scenario())
    expected = [str(i) for i in range(20)] + ["end"]
    assert got == {"first": expected, "reloaded": expected, "late": expected}


def test_the_hub_and_a_lone_reader_read_through_the_client_s_one_stream_reader(client):
    """The hub holds nothing of the client but its ``StreamReader`` (no Redis connection, keys or reaper of its
    own), and what it delivers is what ``OwletClient.events`` yields for the same stream, the vanished-stream
    sentence included."""
    async def scenario():
        hub = StreamHub(SimpleNamespace(stream_reader=client.stream_reader), tick_s=0.01, block_ms=50,
                        idle_check_s=0.3)
        got: dict[str, list] = {"kept": [], "gone": []}
        ended = {job: asyncio.Event() for job in got}

        def deliverer(job):
            def deliver(events, is_end):
                got[job].extend(events)
                if is_end:
                    ended[job].set()
            return deliver

        for text in ("a", "b"):
            client.r.xadd(client.keys.stream("kept"), encode("token", text=text))
        client.r.xadd(client.keys.stream("kept"), encode("done", text="ab"))
        client.r.xadd(client.keys.stream("gone"), encode("token", text="x"))
        for job in got:
            hub.subscribe(job, deliverer(job))
        await asyncio.sleep(0.2)
        client.r.delete(client.keys.stream("gone"))  # expired under its readers
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ended.values())), timeout=10)
        hub.close()
        return got

    got = asyncio.run(scenario())
    assert got["kept"] == [event for _, event in client.events("kept")]
    assert [(e["type"], e.get("message")) for e in got["gone"]] == [("token", None),
                                                                    ("error", UnknownJob.user_message)]


def test_one_hub_follows_many_streams_in_order_until_their_terminal_events(client):
    async def scenario():
        hub = StreamHub(client, tick_s=0.01, block_ms=50, idle_check_s=0.3)
        got = {job: [] for job in ("a", "b", "c")}
        ended = asyncio.Event()
        done: set[str] = set()

        def deliverer(job):
            def deliver(events, is_end):
                got[job].extend(e["type"] + ":" + e.get("text", e.get("message", "")) for e in events)
                if is_end:
                    done.add(job)
                    if len(done) == 3:
                        ended.set()
            return deliver

        subs = [hub.subscribe(job, deliverer(job)) for job in ("a", "b", "c")]
        for i in range(20):
            for job in ("a", "b"):
                client.r.xadd(client.keys.stream(job), encode("token", text=str(i)))
        for job in ("a", "b"):
            client.r.xadd(client.keys.stream(job), encode("done", text="x"))
            client.r.xadd(client.keys.stream(job), encode("token", text="after the end"))
        # "c" never gets a stream: the hub's idle check ends it with a sentence, not a hang
        await asyncio.wait_for(ended.wait(), timeout=10)
        assert hub.live == 0
        for s in subs:
            hub.unsubscribe(s)
        hub.close()
        return got

    got = asyncio.run(scenario())
    for job in ("a", "b"):
        assert got[job] == [f"token:{i}" for i in range(20)] + ["done:x"]
    assert got["c"] == ["error:" + UnknownJob.user_message]


def _follow_through_outage(tmp_path, grace_s: float, down_s: float) -> tuple[list[str], bool]:
    """Follow one stream on a Redis of the test's own, stop that Redis for ``down_s``, start it again from its
    append-only file and finish the stream. Returns what the follower got and whether it ended."""
    store = OwnedRedis(tmp_path / "redis")
    c = OwletClient(settings=Settings.from_env(redis_url=store.url, key_prefix=unique_prefix("outage")))
    key = c.keys.stream("job")

    async def scenario():
        hub = StreamHub(c, tick_s=0.01, block_ms=50, idle_check_s=0.3, outage_grace_s=grace_s)
        got, ended = [], asyncio.Event()

        def deliver(events, is_end):
            got.extend(e["type"] + ":" + e.get("text", e.get("message", "")) for e in events)
            if is_end:
                ended.set()
        sub = hub.subscribe("job", deliver)
        c.r.xadd(key, encode("token", text="before"))
        await asyncio.sleep(1.2)  # past the append-only file's once-a-second fsync
        await asyncio.to_thread(store.stop)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(store.start)
        if not ended.is_set():  # the worker goes on where it was, as after a real restart
            c.r.xadd(key, encode("token", text="after"))
            c.r.xadd(key, encode("done", text="before after"))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ended.wait(), timeout=10)
        hub.unsubscribe(sub)
        hub.close()
        return got, ended.is_set()

    try:
        return asyncio.run(scenario())
    finally:
        c.close(purge=True)
        store.stop()


def test_a_redis_restart_within_the_grace_resumes_the_answer(tmp_path):
    """Nobody is told "try again" while their answer is still being made: the follower hears the page is
    reconnecting, then gets the rest of the stream and its own terminal event."""
    got, ended = _follow_through_outage(tmp_path, grace_s=30, down_s=2.0)
    assert ended
    assert got == ["token:before", "notice:" + wording.RECONNECTING, "token:after", "done:before after"], got


def test_an_outage_longer_than_the_grace_ends_the_stream_with_a_sentence(tmp_path):
    got, ended = _follow_through_outage(tmp_path, grace_s=1.0, down_s=3.0)
    assert ended
    assert got == ["token:before", "notice:" + wording.RECONNECTING, "error:" + wording.SERVICE_DOWN], got


def test_component_updates_share_one_api_schema_equal_to_pydantics():
    """The box is locked and unlocked with a component update every turn; Gradio builds a new instance and its
    API schema each time. ``share_component_schemas`` computes that schema once per class and data model."""
    import gradio as gr
    from gradio.components.multimodal_textbox import MultimodalData

    from ui.gradio_adapters.event_costs import share_component_schemas

    share_component_schemas()
    share_component_schemas()  # idempotent: the method is wrapped once
    locked = gr.MultimodalTextbox(interactive=False, submit_btn=False, stop_btn=True, render=False)
    unlocked = gr.MultimodalTextbox(interactive=True, render=False)
    assert locked.api_info() is unlocked.api_info(), "one schema for every instance of the class"
    expected = MultimodalData.model_json_schema()
    expected["additional_description"] = expected.pop("description", None)
    assert unlocked.api_info() == expected
    chat = gr.Chatbot(render=False)
    assert chat.api_info() is not unlocked.api_info() and chat.api_info() == gr.Chatbot(render=False).api_info()


def test_a_waiting_answer_costs_no_stream_read_and_is_read_again_the_moment_it_starts(client):
    """Two answers wait in line (no worker): the hub reads each stream once (its "queued" event), then hands the
    followers their places from one batched poll, never reading their streams while they wait. One starts: its
    notice brings it back to the reads at once (the poll is 5 s apart here, so the notice is what did it). An answer
    submitted without this hub's notice stream (a reloaded tab) is found started by the next poll."""
    async def scenario():
        hub = StreamHub(client, tick_s=0.01, block_ms=50, idle_check_s=0.3, place_poll_s=5.0)
        asked: list[set] = []
        xread = client.r.xread

        def spying_xread(streams, **kwargs):
            asked.append(set(streams))
            return xread(streams, **kwargs)

        client.r.xread = spying_xread
        first = client.submit("ann", None, "first?", group="a", notify=hub.started_key).job
        second = client.submit("bob", None, "second?", group="b", notify=hub.started_key).job
        got = {first: [], second: []}

        def deliverer(job):
            return lambda events, ended: got[job].extend(events)

        subs = [hub.subscribe(job, deliverer(job)) for job in (first, second)]
        hub.place_poll_s = 0.2
        await asyncio.sleep(0.8)
        assert [e["type"] for e in got[first]][:1] == ["queued"] and any(e["type"] == "place" for e in got[first])
        assert {e["position"] for e in got[second] if e["type"] == "place"} == {2}
        asked.clear()
        await asyncio.sleep(0.3)
        waiting_keys = {client.keys.stream(first), client.keys.stream(second)}
        assert asked and not any(keys & waiting_keys for keys in asked), "a waiting answer's stream is not read"
        hub.place_poll_s = 5.0
        job, n, _ = client.jobs.pop(10)
        assert job == first
        started_at = time.monotonic()
        client.jobs.claim(first, n, "w@test")  # a worker starts it: its start is announced to this hub
        while not any(e["type"] == "started" for e in got[first]):
            assert time.monotonic() - started_at < 2, "the started answer was not read again at once"
            await asyncio.sleep(0.01)
        assert time.monotonic() - started_at < 1.0

        third = client.submit("cy", None, "third?", group="c").job  # no notice stream named: found by the poll
        got[third] = []
        subs.append(hub.subscribe(third, deliverer(third)))
        hub.place_poll_s = 0.2
        await asyncio.sleep(0.3)
        job, n, _ = client.jobs.pop(10)
        assert job == second
        job, n, _ = client.jobs.pop(10)
        assert job == third
        client.jobs.claim(third, n, "w@test")
        deadline = time.monotonic() + 3
        while not any(e["type"] == "started" for e in got[third]):
            assert time.monotonic() < deadline, "an answer that started without a notice was never read again"
            await asyncio.sleep(0.02)
        for s in subs:
            hub.unsubscribe(s)
        hub.close()
        client.r.xread = xread

    asyncio.run(scenario())
