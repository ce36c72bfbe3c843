"""Real Celery worker (threads pool) + real engine with the tiny LFM2-VL model + real Redis."""
from __future__ import annotations

import hashlib
import json

import pytest

from tests.redis_server import unique_prefix
from tests.worker.live import collect, png, types, wait_for
from tests.worker.worker_process import WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings


# A random-init model may emit EOS at any point; ignoring it keeps a generation running long enough to
# cancel (or kill its worker) mid-way.
LONG = {"max_new_tokens": 1500, "ignore_eos": True}


@pytest.fixture(scope="module")
def live(redis_url, tmp_path_factory):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("live"), heartbeat_interval_s=0.5,
                                 heartbeat_ttl_s=2.0, history_max_turns=6, max_images_per_request=2)
    client = OwletClient(settings=settings)
    proc = WorkerProcess(worker_env(settings, ensure_tiny_checkpoint("lfm2vl")), tmp_path_factory.mktemp("logs"))
    try:
        proc.wait_ready(client)
        yield client, proc
    finally:
        proc.stop()
        client.close(purge=True)


def test_job_streams_tokens_and_appends_answer_once(live):
    client, proc = live
    sha = client.put_image(png())
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "What colour is the square?", image_sha=sha,
                             sampling={"max_new_tokens": 12})
    events = collect(client, job)
    assert types(events) == ["queued", "started", "token", "done"], events
    assert events[1]["worker"] == proc.name
    done = events[-1]
    assert done["text"] == "".join(e["text"] for e in events if e["type"] == "token")
    assert done["finish_reason"] in ("length", "eos") and done["stats"]["generated_tokens"] >= 1
    assert client.history("ann", conv) == [
        {"role": "user", "text": "What colour is the square?", "image_sha": sha},
        {"role": "assistant", "text": done["text"], "image_sha": None}]
    assert client.job_state(job) == "done" and client.queue_position(job) is None


def test_follow_up_turn_goes_to_the_worker_holding_the_conversation(live):
    client, proc = live
    conv = client.new_conversation("ann")
    before = client.health()
    first = collect(client, client.submit_turn("ann", conv, "Describe it.", sampling={"max_new_tokens": 6}))
    second = collect(client, client.submit_turn("ann", conv, "And then?", sampling={"max_new_tokens": 6}))
    after = client.health()
    # no restart: the direct queue delivered it (a lost dispatch would show a second "queued")
    assert types(first) == types(second) == ["queued", "started", "token", "done"]
    assert second[1]["worker"] == proc.name
    assert after["affinity_hits"] == before.get("affinity_hits", 0) + 1  # only the follow-up counts
    assert after["affinity_hit_rate"] > 0
    # the worker's engine kept the conversation's cache, so the follow-up reused its prefix
    assert second[-1]["stats"]["cached_tokens"] > 0
    assert [t["role"] for t in client.history("ann", conv)] == ["user", "assistant", "user", "assistant"]


def test_cancel_frees_the_slot_and_ends_with_cancelled(live):
    client, _ = live
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "Talk for a long time.", sampling=LONG)
    stream = client.events(job)
    for _, event in stream:
        if event["type"] == "token":
            break
    assert client.cancel("ann", job) is True
    rest = [e for _, e in stream]
    assert rest[-1]["type"] == "cancelled", rest[-1]
    # the engine slot is free again: the heartbeat reports nothing running
    wait_for(lambda: all(w["running"] == 0 for w in client.health()["workers"]), 5, "engine slot freed")
    assert [t["role"] for t in client.history("ann", conv)] == ["user"]  # no answer appended
    assert collect(client, client.submit_turn("ann", conv, "Short one.", sampling={"max_new_tokens": 3}))[-1][
        "type"] == "done"


def _raw_job(client, payload, job_id=None, user="ann", conv="c"):
    job_id = job_id or hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()
    client.jobs.enqueue_raw(job_id, user, conv, payload if isinstance(payload, str) else json.dumps(payload))
    client.dispatch()
    return job_id


def _payload(client, user="ann", **changes):
    conv = client.new_conversation(user)
    p = {"user": user, "conv": conv, "turn": 0, "messages": [{"role": "user", "text": "hi", "image_sha": None}],
         "sampling": {"max_new_tokens": 3}}
    p.update(changes)
    return p


@pytest.mark.parametrize("case, expected", [
    ("missing_image", "upload it again"),
    ("expired_image", "upload it again"),
    ("unknown_conversation", "no longer exists"),
    ("oversized_history", "too long"),
    ("turn_not_int", "'turn' must be a non-negative integer"),
    ("messages_not_list", "history as a non-empty list"),
    ("bad_sampling", "temperature"),
    ("not_json", "not valid JSON"),
    ("too_many_images", "already holds 2 images"),  # counted before any is loaded: the images do not exist
])
def test_malformed_payloads_end_in_error_and_the_worker_keeps_serving(live, case, expected):
    client, proc = live
    p = _payload(client)
    if case == "missing_image":
        p["messages"][0]["image_sha"] = "0" * 64
    elif case == "expired_image":
        sha = client.put_image(png((1, 2, 3)))
        client.r.delete(client.keys.image(sha))
        p["messages"][0]["image_sha"] = sha
    elif case == "unknown_conversation":
        p["conv"] = "no-such-conversation"
    elif case == "oversized_history":
        p["messages"] = [{"role": "user", "text": "x"}, {"role": "assistant", "text": "y"}] * 4 + [
            {"role": "user", "text": "z"}]
    elif case == "turn_not_int":
        p["turn"] = "first"
    elif case == "messages_not_list":
        p["messages"] = "hi"
    elif case == "bad_sampling":
        p["sampling"] = {"temperature": "hot"}
    elif case == "too_many_images":
        p["messages"] = [{"role": "user", "text": "look", "image_sha": f"{i}" * 64} for i in range(3)]
    job_id = hashlib.sha1(case.encode() + p["conv"].encode()).hexdigest()
    p["job_id"] = job_id
    _raw_job(client, "{not json" if case == "not_json" else p, job_id=job_id)
    events = collect(client, job_id, timeout_s=30)
    assert types(events) == ["queued", "started", "error"], events
    assert expected in events[-1]["message"]
    # the worker is alive and still serves a good job
    assert proc.proc.poll() is None
    conv = client.new_conversation("bob")
    assert collect(client, client.submit_turn("bob", conv, "ok?", sampling={"max_new_tokens": 2}))[-1]["type"] == "done"
