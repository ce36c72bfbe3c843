"""A worker takes no more jobs at once than it has Celery threads to run them, whatever its engine could batch.

Each job holds a Celery thread while it streams. A worker that announced its engine's capacity (``max_running``)
with fewer threads than that would be sent jobs no thread picks up: the reaper would take them for a dead worker's
and they would end "stopped unexpectedly" (e.g. the page benchmark's stub engine at 64 slots behind the demo's 18
threads). So the capacity a worker announces is the smaller of the two, and it says so at start."""
from __future__ import annotations

import time

import pytest

from tests.redis_server import unique_prefix
from tests.worker.live import collect, types
from tests.worker.worker_process import WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings

pytestmark = pytest.mark.timeout(120)


def test_a_worker_with_fewer_threads_than_engine_slots_runs_every_job(redis_url, tmp_path):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("capacity"), heartbeat_interval_s=0.5,
                                 heartbeat_ttl_s=2.0)
    client = OwletClient(settings=settings)
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"), max_running=8,
                     OWLET_ENGINE_FACTORY="bench.stub_engine:from_env", OWLET_STUB_TOKENS_PER_S="10")
    proc = WorkerProcess(env, tmp_path, concurrency=3)
    try:
        proc.wait_ready(client)
        (worker,) = client.health()["workers"]
        assert worker["capacity"] == 3, "announces what its threads can run, not the engine's 8"
        warning = "3 Celery threads for an engine that holds 8 answers at once"
        deadline = time.monotonic() + 10  # written just after the heartbeat that wait_ready saw
        while warning not in proc.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert warning in proc.log(), "it says so at start"
        jobs = []
        # twice the threads, each answer 15 s: longer than a dispatched job may wait unclaimed, twice (3 heartbeat TTLs each)
        for i in range(6):
            conv = client.new_conversation(f"user{i}")
            jobs.append(client.submit_turn(f"user{i}", conv, "hi", sampling={"max_new_tokens": 150}))
        ends = [types(collect(client, job, timeout_s=60))[-1] for job in jobs]
        assert ends == ["done"] * 6, proc.log()[-3000:]
    finally:
        proc.stop()
        client.close(purge=True)
