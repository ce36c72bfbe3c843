"""What users see when Redis restarts under multi-user load (a Redis this test owns; never the shared one).

Four users each finish a first turn, then all ask a long second question; while those answers stream, the
Redis server is stopped, kept down for a few seconds, and started again from its append-only file. The
page and the worker are not restarted. Afterwards:

- every second turn ended with its whole answer: the page said it was reconnecting and resumed each stream;
- every conversation still has its completed first turn;
- every user's next question is answered (nothing stays "answering");
- every job in Redis is in a terminal state.
"""
from __future__ import annotations

import concurrent.futures
import os
import re
import signal
import time

import pytest
import redis
from gradio_client import Client

from tests.deploy.services import Service, clean_env, wait_for_workers
from tests.redis_server import OwnedRedis, unique_prefix
from tests.ui.page_client import ask, bubble_text, submit, wait_for_first_token
from tests.ui.stack import free_port, make_image, tiny_model

pytestmark = pytest.mark.timeout(600)
USERS = 4
DOWN_S = 6.0  # longer than redis-py's own retries (~2-5 s), so the outage is really seen
SECOND_ANSWER_TOKENS = 1000  # leaves room in the tiny model's 2,048-token context for the third turn
# Every user shows the same picture, and the worker runs fp32, where batching never changes a greedy answer:
# the tiny random model then gives every user the same second answer, one that runs at least 600 tokens
# (checked) instead of stopping at its own end-of-text after ~100, so every answer is still streaming when
# the outage lands.
PICTURE_COLOUR = (80, 120, 90)


def test_a_redis_restart_under_load_loses_no_turn_and_needs_no_restart_of_page_or_worker(tmp_path):
    store = OwnedRedis(tmp_path / "redis")
    prefix = unique_prefix("restart")
    env = dict(REDIS_URL=store.url, OWLET_KEY_PREFIX=prefix, OWLET_MODEL=str(tiny_model()), OWLET_DEVICE="cpu",
               OWLET_DTYPE="float32",
               OWLET_MAX_RUNNING="4", OWLET_UI_MAX_NEW_TOKENS_CAP="1024",
               # The four users share one loopback address here: lift the per-address limits, which
               # tests/security covers, so this test measures the restart alone.
               OWLET_UI_ADDRESS_MAX_EVENTS="16", OWLET_UI_ADDRESS_MAX_DECODES="4", OWLET_GROUP_JOB_CAP="16",
               OWLET_GROUP_SUBMIT_LIMIT="500")
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    worker = Service("worker", ["owlet-worker", "-n", "restart@%h", "-c", "8"], clean_env(**env), tmp_path, tmp_path)
    page = Service("page", ["owlet-page", "--port", str(port)], clean_env(**env), tmp_path, tmp_path)
    clients: list[Client] = []
    try:
        wait_for_workers(url, 1, [worker, page], timeout_s=240)
        clients = [Client(url, verbose=False) for _ in range(USERS)]
        images = [make_image(tmp_path / f"u{i}.png", PICTURE_COLOUR) for i in range(USERS)]
        with concurrent.futures.ThreadPoolExecutor(USERS) as pool:
            firsts = list(pool.map(lambda ci: ask(ci[0], "What colour is it?", ci[1], max_new_tokens=8)[1],
                                   zip(clients, images)))
        first_chats = [chat for _box, chat, _status in firsts]
        assert all([m["role"] for m in chat] == ["user", "assistant"] for chat in first_chats)

        # Long second answers for everyone; Redis goes away while they stream.
        jobs = [submit(c, "Describe everything in detail.", max_new_tokens=SECOND_ANSWER_TOKENS) for c in clients]
        for job in jobs:
            wait_for_first_token(job, timeout_s=120)
        # Redis can take seconds to act on SIGTERM on a loaded two-core machine, and a fast CPU decodes the rest
        # of an answer in that time: the worker is held still (as a busy machine would hold it) until Redis is
        # down, so the outage lands mid-answer however fast the machine; it then meets the outage running.
        os.killpg(worker.proc.pid, signal.SIGSTOP)
        try:
            store.stop()
            assert not any(job.done() for job in jobs), "the restart must land while answers are streaming"
        finally:
            os.killpg(worker.proc.pid, signal.SIGCONT)
        time.sleep(DOWN_S)
        store.start()

        seconds = [job.result(timeout=300) for job in jobs]
        for _box, chat, status in seconds:
            last = bubble_text(chat[-1])
            # The page waits out the restart (OWLET_REDIS_RECONNECT_S, 60 s) and resumes every stream from
            # where it stopped: each answer ends complete, nobody is told to try again while it is being made.
            answered = chat[-1]["role"] == "assistant" and "Answered in" in status
            assert answered, (status, last[-300:])
            assert "Traceback" not in last + status and "Error(" not in last + status, (status, last[-300:])
            streamed = int(re.search(r"· (\d+) tokens ·", status).group(1))
            assert streamed >= 600, f"the premise of PICTURE_COLOUR no longer holds: {status}"
        worker.check_alive()
        page.check_alive()

        # Every job has ended by now (the page followed each to its terminal event); check it in Redis too.
        r = redis.Redis.from_url(store.url)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and any(
                r.hget(key, "state") not in (b"done", b"error", b"cancelled")
                for key in r.scan_iter(match=prefix + "job:*")):
            time.sleep(0.5)
        r.close()

        # The next question works for everyone, and the completed first turns are still there.
        with concurrent.futures.ThreadPoolExecutor(USERS) as pool:
            thirds = list(pool.map(lambda c: ask(c, "Is there a circle?", max_new_tokens=8)[1], clients))
        for first_chat, (_box, chat, status) in zip(first_chats, thirds):
            assert "Answered in" in status, status
            assert chat[-1]["role"] == "assistant" and chat[-2]["role"] == "user"
            assert [bubble_text(m) for m in chat[:2]] == [bubble_text(m) for m in first_chat], "turn 1 survived"

        r = redis.Redis.from_url(store.url)
        states = {key: r.hget(key, "state") for key in r.scan_iter(match=prefix + "job:*")}
        assert len(states) == 3 * USERS, states
        assert all(state in (b"done", b"error", b"cancelled") for state in states.values()), states
        r.close()
    finally:
        for client in clients:
            client.close()
        page.stop()
        worker.stop()
        store.stop() if store.proc.poll() is None else None
