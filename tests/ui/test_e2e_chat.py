"""End to end through gradio_client against a real stack: image upload, two turns with the session cache,
streamed partial updates, Stop, a bad image, and /healthz and /metrics."""
from __future__ import annotations

import json
import re
import time
import urllib.request

import pytest
import redis
from gradio_client import Client

from tests.ui.page_client import (METRICS_TOKEN, ask, bubble_text, engine_running, identity, metrics_text, submit,
                                  wait_for_first_token)
from tests.ui.stack import make_image
from ui.shared import wording

pytestmark = pytest.mark.timeout(240)


def stored_answers(stack) -> set[str]:
    """Every assistant turn the workers stored in this stack's namespace."""
    r = redis.Redis.from_url(stack.redis_url)
    answers = {json.loads(raw).get("text") for key in r.scan_iter(match=stack.prefix + "conv:*:turns", count=1000)
               for raw in r.lrange(key, 0, -1) if json.loads(raw).get("role") == "assistant"}
    r.close()
    return answers


def test_two_turns_stream_and_the_follow_up_hits_the_session_cache(stack, tmp_path):
    client = Client(stack.url, verbose=False)
    outputs, (_box, chat, status) = ask(client, "What colour is the shape?", make_image(tmp_path / "red.png"))
    answers = [bubble_text(o[1][-1]) for o in outputs if o[1] and o[1][-1]["role"] == "assistant"]
    growing = [a for a in answers if a and not a.startswith(wording.WAITING_MARK)]
    # The first update waits up to 50 ms for the job's first events (ui.chat.streaming.FIRST_UPDATE_S), so on a quiet
    # machine it may already carry tokens; otherwise it is the queue status.
    first = answers[0]
    assert first.startswith(wording.waiting("")) or bubble_text(chat[-1]).startswith(first), answers[:3]
    assert len(set(growing)) >= 3, "the answer should arrive as several partial updates"
    assert all(b.startswith(a) for a, b in zip(growing, growing[1:])), "partials must only grow"
    assert [m["role"] for m in chat] == ["user", "assistant"]
    assert any(isinstance(p, dict) and p.get("type") == "file" for p in chat[0]["content"]), "image shown"
    # What a visitor reads first; the figures follow in a toggle that opens on demand.
    assert re.match(r"Answered in \d+(\.\d\d?)? s(, [^<]+)? <details", status), status
    assert re.search(r"<summary>details</summary>First token \d+\.\d+ s · [\d.]+ tokens/s", status), status
    assert "session cache miss" in status and "session cache hit" not in status

    assert bubble_text(chat[1]) in stored_answers(stack), "the streamed answer ends exactly as the worker's"

    _outputs, (_box, chat2, status2) = ask(client, "And where is it?")
    assert [m["role"] for m in chat2] == ["user", "assistant", "user", "assistant"]
    assert bubble_text(chat2[1]) == bubble_text(chat[1]), "the first answer is kept as stored"
    assert "session cache hit" in status2, status2


def test_stop_cancels_the_answer_and_frees_the_slot(endless_stack, tmp_path):
    stack = endless_stack
    client = Client(stack.url, verbose=False)
    # A long answer (this stack's model never stops by itself), so Stop lands mid-answer.
    job = submit(client, "Describe everything in detail.", make_image(tmp_path / "blue.png", (20, 20, 220)),
                 max_new_tokens=1500)
    wait_for_first_token(job)
    _box, stop_status = client.predict(identity(client), api_name="/stop")
    assert stop_status.startswith("Stopped.")
    _box, chat, status = job.result(timeout=60)
    assert bubble_text(chat[-1]).endswith("*(stopped)*"), bubble_text(chat[-1])[-80:]
    assert status == "Stopped."
    # The engine slot is free again: no request left running, and the next question is answered.
    deadline = time.monotonic() + 10
    while engine_running(metrics_text(stack)) > 0:
        assert time.monotonic() < deadline, "the cancelled request still holds an engine slot"
        time.sleep(0.2)
    _outputs, (_b, chat2, status2) = ask(client, "Hello again?")
    assert "Answered in" in status2 and chat2[-1]["role"] == "assistant"
    assert [m["role"] for m in chat2] == ["user", "assistant", "user", "assistant"], "a stopped answer is not stored"
    assert bubble_text(chat2[1]) == "*(no answer)*", "it is marked, not merged with the next question"


def test_new_conversation_ends_the_answer_in_progress_and_the_next_question_starts_afresh(endless_stack, tmp_path):
    stack = endless_stack
    client = Client(stack.url, verbose=False)
    job = submit(client, "Describe everything in detail.", make_image(tmp_path / "green.png", (20, 200, 20)),
                 max_new_tokens=1500)
    wait_for_first_token(job)
    _box, chat, status = client.predict(identity(client), api_name="/new_conversation")
    assert chat == [] and status == wording.NEW_CONVERSATION, status
    job.result(timeout=60)  # the old stream ends by itself (its job cancelled), sending nothing after the reset
    deadline = time.monotonic() + 10
    while engine_running(metrics_text(stack)) > 0:
        assert time.monotonic() < deadline, "the abandoned answer still holds an engine slot"
        time.sleep(0.2)
    _outputs, (_b, chat2, status2) = ask(client, "Hello again?")
    assert "Answered in" in status2, status2
    assert [m["role"] for m in chat2] == ["user", "assistant"], "the next question starts a new conversation"
    _box, stop_status = client.predict(identity(client), api_name="/stop")
    assert stop_status == wording.NOTHING_TO_STOP, "nothing was running any more"


def test_bad_image_gets_a_clear_message_and_nothing_is_queued(stack, tmp_path):
    bad = tmp_path / "photo.png"
    bad.write_bytes(b"definitely not a png" * 50)
    r = redis.Redis.from_url(stack.redis_url)

    def user_data() -> set[bytes]:  # images, conversations, jobs and queues; not the workers' own housekeeping
        return {k for kind in ("img", "conv", "job", "uq", "stream") for k in
                r.scan_iter(match=f"{stack.prefix}{kind}:*", count=1000)}

    stored_before = user_data()
    client = Client(stack.url, verbose=False)
    _outputs, (box, chat, status) = ask(client, "What is this?", bad)
    assert status.startswith("This file is not an image we can read")
    assert bubble_text(chat[-1]) == wording.warning(status)
    assert box["value"]["text"] == "What is this?", "the question is kept so the user can attach another image"
    assert user_data() == stored_before, "nothing reached Redis"
    r.close()
    assert re.search(r'owlet_ui_errors_total\{kind="image_rejected"\} [1-9]', metrics_text(stack))


def test_healthz_and_metrics(stack):
    authorised = urllib.request.Request(stack.url + "healthz", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    health = json.load(urllib.request.urlopen(authorised))
    assert health["ok"] and health["redis"] and len(health["workers"]) == 1
    assert json.load(urllib.request.urlopen(stack.url + "healthz")) == {"ok": True}, "strangers learn only ok"
    text = metrics_text(stack)
    for name in ("owlet_workers_alive 1.0", "owlet_redis_up 1.0", "owlet_num_requests_waiting",
                 "owlet_time_to_first_token_seconds_bucket", "owlet_time_per_output_token_seconds_bucket",
                 'owlet_affinity_total{result="hit"}', "owlet_batch_occupancy "):
        assert name in text, name

