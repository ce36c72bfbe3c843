"""Eight simulated users at once through gradio_client: all are answered, and the engine batched them.

Batch occupancy comes from the page's /metrics (``owlet_engine_running``, fed by worker heartbeats),
sampled while the eight answers stream.
"""
from __future__ import annotations

import threading
import time

import pytest
from gradio_client import Client

from tests.ui.page_client import engine_running, metrics_text, submit

pytestmark = pytest.mark.timeout(300)
USERS = 8


def test_eight_users_at_once_are_all_answered_and_batched_together(stack):
    clients = [Client(stack.url, verbose=False) for _ in range(USERS)]  # one session (user) each
    peak, stop = [0.0], threading.Event()

    def sample_occupancy():
        while not stop.is_set():
            peak[0] = max(peak[0], engine_running(metrics_text(stack)))
            time.sleep(0.1)

    sampler = threading.Thread(target=sample_occupancy, daemon=True)
    sampler.start()
    try:
        jobs = [submit(c, f"User {i}: what do you see?", max_new_tokens=256) for i, c in enumerate(clients)]
        results = [job.result(timeout=240) for job in jobs]
    finally:
        stop.set()
        sampler.join(timeout=5)
    for box, chat, status in results:
        assert chat[-1]["role"] == "assistant" and "Answered in" in status, status
    print(f"peak engine batch: {peak[0]:.0f} of {USERS} users")
    assert peak[0] >= USERS // 2, f"the engine ran at most {peak[0]:.0f} requests together"
