"""The worker runtime in-process (real engine, tiny model, real Redis), driving ``run_job`` directly.

Covers paths that need precise control: run deadlines, cancel before start, duplicate deliveries, metrics.
"""
from __future__ import annotations

import json
import time
import urllib.request

import pytest

from engine import EngineConfig, LLMEngine
from tests.redis_server import free_port
from tests.worker.live import collect, types
from tests.worker.test_worker_jobs import LONG
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.celery_app import create_app
from worker.client import OwletClient
from worker.store.keys import EntryField, JobField
from worker.serving.runtime import WorkerRuntime


@pytest.fixture
def runtime_client(settings, request):
    overrides = getattr(request, "param", {})  # settings of the test's own
    settings = type(settings)(**{**vars(settings), "job_deadline_s": 60.0, "heartbeat_interval_s": 0.2,
                                 "worker_metrics_port": free_port(), **overrides})
    engine = LLMEngine(EngineConfig(model=str(ensure_tiny_checkpoint("lfm2vl")), device="cpu", max_running=2))
    runtime = WorkerRuntime(settings, create_app(settings), "inproc@test", engine=engine)
    runtime.start()
    client = OwletClient(settings=settings)
    try:
        yield runtime, client
    finally:
        runtime.stop()
        client.close(purge=True)


def dispatched(client, job_id) -> int:
    """The dispatch number the dispatcher gave the job (its Celery message sits unconsumed in Redis)."""
    client.dispatch()
    return int(client.r.hget(client.keys.job(job_id), JobField.dispatch_n))


@pytest.mark.parametrize("runtime_client", [{"job_deadline_s": 0.5}], indirect=True)
def test_job_past_its_deadline_ends_with_a_clear_error(runtime_client):
    runtime, client = runtime_client
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "Talk for a long time.", sampling=LONG)
    runtime.run_job(job, dispatched(client, job))
    events = collect(client, job)
    assert types(events)[-1] == "error" and "took too long" in events[-1]["message"]
    assert [t["role"] for t in client.history("ann", conv)] == ["user"]
    # the engine drops the aborted answer at its next step, which a busy host may run a moment after the job ended
    deadline = time.monotonic() + 10
    while runtime.engine.stats()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert runtime.engine.stats()["running"] == 0, "the answer past its deadline still holds an engine row"


@pytest.mark.parametrize("runtime_client", [{"stream_coalesce_s": 1.0}], indirect=True)
def test_an_answers_last_tokens_go_with_its_finish_not_through_the_batcher(runtime_client, monkeypatch):
    runtime, client = runtime_client
    batched: list[str] = []
    add = runtime.batcher.add

    def recording_add(key, fields, maxlen):
        batched.append(json.loads(fields[EntryField.data])["text"])
        return add(key, fields, maxlen)

    monkeypatch.setattr(runtime.batcher, "add", recording_add)
    for _ in range(3):  # an answer whose tokens all came before the runner's first take leaves no tail: again
        batched.clear()
        job = client.submit_turn("ann", client.new_conversation("ann"), "hi", sampling={**LONG, "max_new_tokens": 24})
        runtime.run_job(job, dispatched(client, job))
        events = collect(client, job)
        texts = [e["text"] for e in events if e["type"] == "token"]
        assert types(events)[-1] == "done" and "".join(texts) == events[-1]["text"], "the tokens add up to the answer"
        assert texts[:1] != batched[:1], "the first write goes out at once, not through the batcher"
        if len(texts) >= 2 and texts[1:-1] == batched:
            break  # the first write at once, the ones between through the batcher, the last with the finish
    assert len(texts) >= 2 and texts[1:-1] == batched, (texts, batched)


def test_cancel_before_start_never_reaches_the_engine(runtime_client):
    runtime, client = runtime_client
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi", sampling={"max_new_tokens": 2})
    n = dispatched(client, job)
    assert client.cancel("ann", job) is True  # dispatched, not started: ended at once
    runtime.run_job(job, n)  # the worker that receives it cannot claim it
    assert types(collect(client, job)) == ["queued", "cancelled"]

    # A cancel racing the claim leaves its flag on a job just started: the runner reads it before the engine.
    job = client.submit_turn("ann", conv, "hi", sampling={"max_new_tokens": 2})
    n = dispatched(client, job)
    client.r.set(client.keys.cancel(job), 1)
    runtime.run_job(job, n)
    assert types(collect(client, job)) == ["queued", "started", "cancelled"]
    assert runtime.engine.stats()["requests_finished"] == 0


def test_duplicate_delivery_runs_once_and_metrics_record_it(runtime_client):
    runtime, client = runtime_client
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi", sampling={"max_new_tokens": 3})
    n = dispatched(client, job)
    runtime.run_job(job, n)
    runtime.run_job(job, n)  # e.g. a redelivered Celery message
    events = collect(client, job)
    assert types(events) == ["queued", "started", "token", "done"]
    assert [t["role"] for t in client.history("ann", conv)] == ["user", "assistant"]
    reg = runtime.metrics.registry
    assert reg.get_sample_value("owlet_worker_ttft_seconds_count", {"worker": "inproc@test"}) == 1
    assert reg.get_sample_value("owlet_worker_jobs_total", {"worker": "inproc@test", "outcome": "done"}) == 1
    assert reg.get_sample_value("owlet_generation_tokens_total", {"worker": "inproc@test"}) == 3
    url = f"http://127.0.0.1:{runtime.settings.worker_metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    assert 'owlet_worker_jobs_total{outcome="done",worker="inproc@test"} 1.0' in body


def test_bad_dispatch_number_fails_only_a_waiting_job(runtime_client):
    runtime, client = runtime_client
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi", sampling={"max_new_tokens": 2})
    dispatched(client, job)
    runtime.run_job(job, "one")
    events = collect(client, job)
    assert events[-1]["type"] == "error" and "malformed" in events[-1]["message"]
    runtime.run_job(None, 1)  # no job id at all: dropped with a log line, the worker carries on


def test_the_session_cache_share_is_the_client_groups_not_the_users(runtime_client):
    """Two identities from one network share one share of the engine's session cache: the runner names the group
    SUBMIT recorded (the address the page derived), so minting identities does not buy more cache."""
    runtime, client = runtime_client
    for user in ("ann", "bob"):
        conv = client.new_conversation(user)
        job = client.submit(user, conv, "hi", sampling={"max_new_tokens": 2}, group="203.0.113.9").job
        runtime.run_job(job, dispatched(client, job))
        assert types(collect(client, job))[-1] == "done"
    groups = [entry.group for key, entry, _ in runtime.engine.sessions.entries.items() if not key.startswith("prefix:")]
    assert groups == ["203.0.113.9", "203.0.113.9"]
    conv = client.new_conversation("cy")
    job = client.submit_turn("cy", conv, "hi", sampling={"max_new_tokens": 2})  # no group: the user is its own
    runtime.run_job(job, dispatched(client, job))
    assert runtime.engine.sessions.entries.items()[-1][1].group == "cy"


def test_the_page_benchmarks_stub_engine_serves_jobs_through_the_runtime(settings):
    """bench/page_stream.py runs the real worker on ``bench.stub_engine``: it must take every argument the runtime
    passes: a keyword the stub lacks fails every job with "internal error"."""
    from bench.stub_engine import StubEngine

    runtime = WorkerRuntime(settings, create_app(settings), "stub@test", engine=StubEngine(200.0, 4))
    runtime.start()
    client = OwletClient(settings=settings)
    try:
        conv = client.new_conversation("ann")
        job = client.submit_turn("ann", conv, "hi", sampling={"max_new_tokens": 3})
        runtime.run_job(job, dispatched(client, job))
        events = collect(client, job)
        assert types(events)[-1] == "done", events
        assert len(events[-1]["text"].split()) == 3
    finally:
        runtime.stop()
        client.close(purge=True)


class CountingEvent:
    """The runtime's dispatch wake-up, counting who asks for a pass."""

    def __init__(self, real):
        self.real, self.sets = real, 0

    def set(self):
        self.sets += 1
        self.real.set()

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_a_freed_slot_wakes_a_dispatch_pass_only_when_its_finish_did_not_look_for_the_next_job(runtime_client):
    """A finish that takes the next job in the slot it frees runs POP itself; finding nothing, a dispatch pass a
    moment later (heartbeats read, POP again: three round trips) would find nothing too. A finish that took nothing
    because taking is off (shutting down) leaves the slot to a pass, at once."""
    runtime, client = runtime_client
    deadline = time.monotonic() + 10
    while runtime._take_args() is None and time.monotonic() < deadline:  # the first heartbeat tick's reading
        time.sleep(0.05)
    assert runtime._take_args() is not None
    runtime._wake_dispatch = wake = CountingEvent(runtime._wake_dispatch)
    first = client.submit_turn("ann", client.new_conversation("ann"), "hi", sampling={"max_new_tokens": 3})
    runtime.run_job(first, dispatched(client, first))
    assert types(collect(client, first))[-1] == "done"
    assert wake.sets == 0, "the finish found the line empty itself"
    runtime.stop_taking()
    second = client.submit_turn("bob", client.new_conversation("bob"), "hi", sampling={"max_new_tokens": 3})
    runtime.run_job(second, dispatched(client, second))
    assert types(collect(client, second))[-1] == "done"
    assert wake.sets == 1, "a finish that took nothing without looking leaves the slot to a pass"
