"""A real worker takes its next job itself, with the finish of the one before, and stops taking when it shuts down.

A Celery worker (threads pool) whose engine is the model-free stub (``bench/stub_engine.py``) with one row: every job
after the first reaches it in the slot the one before freed (``JobStates.finish_and_take``), not through Celery, and
the fair order holds. A worker told to stop finishes the job in hand and takes no more, so a warm shutdown ends
promptly and the queued jobs wait for another worker. The Redis side is tests/worker/test_take_next.py.
"""
from __future__ import annotations

import time

import pytest

from tests.redis_server import unique_prefix
from tests.worker.live import collect, types, wait_for
from tests.worker.worker_process import WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings
from worker.store.keys import JobField

pytestmark = pytest.mark.timeout(120)


def one_row_worker(redis_url, tmp_path, label: str, rate: str):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix(label), heartbeat_interval_s=0.5,
                                 heartbeat_ttl_s=3.0, group_submit_limit=1000)
    client = OwletClient(settings=settings)
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"), max_running=1,
                     OWLET_ENGINE_FACTORY="bench.stub_engine:from_env", OWLET_STUB_TOKENS_PER_S=rate)
    proc = WorkerProcess(env, tmp_path, concurrency=2)
    proc.wait_ready(client)
    wait_for(lambda: client.dispatch() == 0 and client.health()["workers"], what="the worker's heartbeat")
    return client, proc


def submit(client, user: str, tokens: int) -> str:
    return client.submit_turn(user, client.new_conversation(user), "hi", sampling={"max_new_tokens": tokens})


def test_each_job_after_the_first_is_taken_in_the_slot_the_one_before_freed(redis_url, tmp_path):
    client, proc = one_row_worker(redis_url, tmp_path, "take-live", "100")
    try:
        jobs = [submit(client, f"user{i}", 5) for i in range(4)]
        ends = [types(collect(client, job, timeout_s=60))[-1] for job in jobs]
        assert ends == ["done"] * 4, proc.log()[-3000:]
        targets = [client.r.hget(client.keys.job(job), JobField.target).decode() for job in jobs]
        assert targets[0] == "" and targets[1:] == [proc.name] * 3, \
            f"the first through Celery's shared queue, the rest taken by the worker itself: {targets}"
        started = [float(client.r.hget(client.keys.job(job), JobField.started_at)) for job in jobs]
        assert started == sorted(started), "one row: in the order they waited (four users, round robin)"
    finally:
        proc.stop()
        client.close(purge=True)


def test_a_stopping_worker_finishes_its_job_and_takes_no_more(redis_url, tmp_path):
    client, proc = one_row_worker(redis_url, tmp_path, "take-stop", "20")
    try:
        running = submit(client, "first", 40)  # 2 s at 20 tokens a second
        waiting = [submit(client, f"user{i}", 40) for i in range(5)]
        wait_for(lambda: client.job_state(running) == "started", what="the first job to start")
        t0 = time.monotonic()
        proc.stop()  # SIGTERM: Celery's warm shutdown waits for the task threads
        assert time.monotonic() - t0 < 10, "the worker went on taking jobs while shutting down"
        assert proc.proc.returncode == 0, proc.log()[-3000:]
        assert types(collect(client, running, timeout_s=5))[-1] == "done", "the job in hand is finished"
        # the rest wait for another worker: in line, or (one, sent on when the slot freed, as before this worker took
        # jobs itself) in Celery's queue, which the reaper puts back in line once its grace is over
        assert {client.job_state(job) for job in waiting} <= {"queued", "dispatched"}
        assert not any(client.r.hget(client.keys.job(job), JobField.worker) for job in waiting), "none started"
    finally:
        proc.stop()
        client.close(purge=True)


def test_a_job_started_here_that_no_thread_holds_is_put_back_in_line_and_answered(redis_url, tmp_path):
    """A take whose reply Redis never sent (it went away between running the script and answering) leaves a job
    started on a live worker with no thread to run it; the worker's heartbeat puts it back in line, and it is
    answered."""
    client, proc = one_row_worker(redis_url, tmp_path, "take-lost", "100")
    try:
        busy = submit(client, "ann", 200)  # holds the one row for 2 s
        wait_for(lambda: client.job_state(busy) == "started", what="the first job to start")
        lost = submit(client, "bob", 5)
        assert client.job_state(lost) == "queued", "the row is busy: it waits"
        # the lost reply: the job is taken for this worker by a script whose answer nobody reads
        taken = client.jobs.take(2, 1, proc.name)
        assert taken.job == lost and taken.started is not None and client.job_state(lost) == "started"
        assert types(collect(client, lost, timeout_s=30))[-1] == "done", proc.log()[-3000:]
        assert "no thread holds it (a lost reply)" in proc.log()
        assert int(client.r.hget(client.keys.job(lost), JobField.dispatch_n)) == 2, "put back in line, then run"
        assert types(collect(client, busy, timeout_s=30))[-1] == "done"
    finally:
        proc.stop()
        client.close(purge=True)
