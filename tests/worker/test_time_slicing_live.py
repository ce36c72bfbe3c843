"""A newcomer is answered while one client's long answers hold every decode row (a real Celery worker).

Without time slicing, a client that filled the engine's rows with long answers (thirty addresses streaming
1,024-token answers) made a new visitor wait for the first of them to end: 52 s for a first token. So the
dispatcher keeps the slots beyond the rows for groups with nothing in flight, and the engine pauses a long answer
for the newcomer once it has decoded a slice (``engine.time_slicing``)."""
from __future__ import annotations

import urllib.request

import pytest

from tests.redis_server import free_port, unique_prefix
from tests.worker.live import collect, types, wait_for
from tests.worker.worker_process import WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings

pytestmark = pytest.mark.timeout(180)

LONG = {"max_new_tokens": 600, "ignore_eos": True, "temperature": 0.0}  # each still running when the visitor is answered


def streamed(client, job) -> bool:
    """Whether the job's stream holds a token yet (read without blocking)."""
    return any(fields[b"type"] == b"token" for _, fields in client.r.xrange(client.keys.stream(job)))


def pauses_metric(port: int, worker: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(f'owlet_worker_pauses{{worker="{worker}"}}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


@pytest.mark.parametrize("slice_tokens", ["16", "0"])
def test_a_visitor_is_answered_while_long_answers_hold_every_row(redis_url, tmp_path, slice_tokens):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("slicing"), heartbeat_interval_s=0.5,
                                 heartbeat_ttl_s=3.0)
    client = OwletClient(settings=settings)
    metrics_port = free_port()
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"), max_running=2, OWLET_TIME_SLICE_TOKENS=slice_tokens,
                     OWLET_WORKER_METRICS_PORT=str(metrics_port))
    proc = WorkerProcess(env, tmp_path, concurrency=10)
    try:
        proc.wait_ready(client)
        (worker,) = client.health()["workers"]
        assert worker["capacity"] == (8 if slice_tokens != "0" else 2), "two rows, and six more for newcomers"
        longs = [client.submit_turn("heavy", client.new_conversation("heavy"), f"Tell me a story, part {i}.",
                                    sampling=LONG) for i in range(3)]
        wait_for(lambda: all(streamed(client, j) for j in longs[:2]), what="the long answers to stream")
        visitor = client.submit_turn("visitor", client.new_conversation("visitor"), "hi",
                                     sampling={"max_new_tokens": 4, "ignore_eos": True})
        events = collect(client, visitor, timeout_s=120)
        states = [client.job_state(j) for j in longs]
        if slice_tokens == "0":  # what this test tells apart: without slicing the visitor waits for a long answer
            assert "done" in states, states
        else:
            assert types(events)[-1] == "done", events[-3:]
            assert states == ["started", "started", "queued"], "the visitor waited for a long answer to end"
            assert events[-1]["stats"]["pauses"] == 0
            ends = [collect(client, job, timeout_s=120)[-1] for job in longs[:2]]
            assert [e["type"] for e in ends] == ["done", "done"]
            assert sum(e["stats"]["pauses"] for e in ends) >= 1, "a long answer gave its row to the visitor"
            wait_for(lambda: pauses_metric(metrics_port, worker["worker"]) >= 1, what="the pauses metric")
    finally:
        proc.stop()
        client.close(purge=True)
