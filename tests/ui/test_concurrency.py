"""Eight simulated users at once through gradio_client: all are answered, and the engine batched them.

Batch occupancy comes from the page's /metrics (``owlet_engine_running``, fed by worker heartbeats),
sampled while the eight answers stream. The tiny random model often ends an answer after a few dozen tokens, well
within a heartbeat, so this test runs on ``endless_stack``, whose copy of it never says EOS: every answer runs its
full length. The eight users have their identity tokens before they ask (as a visitor whose page has loaded does)
and ask at once.
"""
from __future__ import annotations

import threading
import time

import pytest
from gradio_client import Client

from tests.ui.page_client import engine_running, identity, metrics_text, submit

pytestmark = pytest.mark.timeout(300)
USERS = 8
MAX_NEW_TOKENS = 400  # each answer, EOS silenced: several heartbeats long even when all eight share the engine


def test_eight_users_at_once_are_all_answered_and_batched_together(endless_stack):
    stack = endless_stack
    clients = [Client(stack.url, verbose=False) for _ in range(USERS)]  # one session (user) each
    for client in clients:
        identity(client)
    peak, stop = [0.0], threading.Event()

    def sample_occupancy():
        while not stop.is_set():
            peak[0] = max(peak[0], engine_running(metrics_text(stack)))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample_occupancy, daemon=True)
    sampler.start()
    try:
        jobs = [submit(c, f"User {i}: what do you see?", max_new_tokens=MAX_NEW_TOKENS) for i, c in enumerate(clients)]
        results = [job.result(timeout=240) for job in jobs]
    finally:
        stop.set()
        sampler.join(timeout=5)
    for box, chat, status in results:
        assert chat[-1]["role"] == "assistant" and "Answered in" in status, status
        assert f"{MAX_NEW_TOKENS} tokens" in status, f"an answer ended before its length limit: {status}"
    print(f"peak engine batch: {peak[0]:.0f} of {USERS} users")
    assert peak[0] >= USERS // 2, f"the engine ran at most {peak[0]:.0f} requests together"
