"""Every job ends: queue timeouts, dead workers (re-dispatch once, then fail), lost dispatches, run deadlines.

Workers here are heartbeats and claims written to the real Redis, so each failure can be staged exactly;
test_worker_failover.py kills a real worker process.
"""
from __future__ import annotations

import time

from worker.heartbeat import Heartbeat, publish
from worker.store.keys import JobField
from worker.queue import reaper


def claim(client, job_id, worker):
    """1 when ``worker`` now owns the job, 0 for a stale or duplicate delivery (CLAIM's answer)."""
    n = client.r.hget(client.keys.job(job_id), JobField.dispatch_n).decode()
    return int(client.jobs.claim(job_id, int(n), worker) is not None)


def beat(client, worker, capacity=1):
    publish(client.r, client.keys, Heartbeat(worker=worker, capacity=capacity), ttl_s=60)


def die(client, worker):
    client.r.delete(client.keys.heartbeat(worker))


def event_types(client, job):
    return [e["type"] for _, e in client.events(job)]


def test_job_that_cannot_start_in_time_ends_with_error(client):
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    assert client.reaper.sweep()["timed_out"] == 0
    later = time.time() + client.settings.queue_timeout_s + 1
    assert client.reaper.sweep(now=later)["timed_out"] == 1
    events = [e for _, e in client.events(job)]
    assert [e["type"] for e in events] == ["queued", "error"]
    assert events[-1]["message"] == reaper.QUEUE_TIMEOUT
    assert client.readouts.queued_total() == 0
    client.submit_turn("ann", conv, "again")  # the conversation is not stuck pending


def test_dead_worker_job_is_redispatched_once_then_failed(client):
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "a@x")
    assert client.dispatch() == 1 and claim(client, job, "a@x") == 1
    die(client, "a@x")
    assert client.reaper.sweep()["requeued"] == 1
    entries = client.r.xrange(client.keys.stream(job))
    assert [f[b"type"] for _, f in entries] == [b"queued", b"started", b"queued"]
    assert client.job_state(job) == "queued" and client.queue_position(job) == 1
    # the old worker's late claim of its stale dispatch is refused
    assert claim(client, job, "a@x") == 0
    beat(client, "b@x")
    assert client.dispatch() == 1 and claim(client, job, "b@x") == 1
    die(client, "b@x")
    assert client.reaper.sweep()["failed"] == 1
    evs = [e for _, e in client.events(job)]
    assert [e["type"] for e in evs] == ["queued", "started", "queued", "started", "error"]
    assert evs[2]["restart"] is True and evs[-1]["message"] == reaper.LOST_AFTER_RETRY
    assert client.history("ann", conv) == [{"role": "user", "text": "hi", "image_sha": None}]
    assert client.r.sismember(client.keys.workers, "a@x") == 0  # forgotten once nothing of it is left


def test_a_stopped_job_whose_worker_is_lost_ends_cancelled_not_queued_again(client):
    """Stop on a job dispatched to a worker that had just died: the page says "Stopped", so the job must not wait
    for the dead worker and be queued again ("the worker answering you was lost"): the chat would refuse every new
    question until a replacement worker ran it."""
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "a@x")
    assert client.dispatch() == 1 and client.job_state(job) == "dispatched"
    assert client.cancel("ann", job) is True
    assert client.job_state(job) == "cancelled", "not started anywhere: ended at once"
    assert claim(client, job, "a@x") == 0, "the worker that receives it later skips it"
    client.submit_turn("ann", conv, "next question")  # the conversation is free at once

    beat(client, "a@x", capacity=4)
    started = client.submit_turn("ann", client.new_conversation("ann"), "hi")
    client.dispatch()
    assert claim(client, started, "a@x") == 1
    assert client.cancel("ann", started) is True and client.job_state(started) == "started"  # flagged
    die(client, "a@x")  # lost before it read the flag
    counts = client.reaper.sweep()
    assert counts["requeued"] == 0 and client.job_state(started) == "cancelled"
    assert event_types(client, started) == ["queued", "started", "cancelled"]


def test_job_sent_to_a_dead_workers_direct_queue_is_redispatched(client):
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "a@x")
    client.dispatch()
    client.r.hset(client.keys.job(job), JobField.target, "a@x")  # as if routed there by affinity
    die(client, "a@x")
    assert client.reaper.sweep()["requeued"] == 1
    assert client.job_state(job) == "queued"


def test_running_job_past_its_deadline_ends_with_error(client):
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "a@x")
    client.dispatch()
    claim(client, job, "a@x")
    later = time.time() + client.settings.job_deadline_s + 3 * client.settings.heartbeat_ttl_s + 1
    beat(client, "a@x")
    assert client.reaper.sweep(now=later)["timed_out"] == 1
    evs = [e for _, e in client.events(job)]
    assert evs[-1]["type"] == "error" and evs[-1]["message"] == reaper.RUN_TIMEOUT


def test_finish_is_exactly_once(client):
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "a@x")
    client.dispatch()
    claim(client, job, "a@x")
    from worker.store.history import turn_json

    answer = turn_json("assistant", "red", job_id=job)
    d = client.jobs
    assert d.finish(job, "done", answer_turn=answer, holder="a@x", only_state="started", only_worker="a@x")
    assert not d.finish(job, "done", answer_turn=answer, holder="a@x")
    assert not d.finish(job, "error", message="late")
    assert [t["role"] for t in client.history("ann", conv)] == ["user", "assistant"]
    assert event_types(client, job) == ["queued", "started", "done"]


def test_answer_is_not_appended_after_its_question_was_truncated_away(client):
    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "a@x")
    client.dispatch()
    claim(client, job, "a@x")
    client.truncate("ann", conv, 0)  # retry/edit while it runs: the job gets its cancel flag
    from worker.store.history import turn_json

    assert client.jobs.finish(job, "done", answer_turn=turn_json("assistant", "late", job_id=job),
                                    only_state="started", only_worker="a@x")
    assert client.history("ann", conv) == []


def test_a_clean_stop_leaves_no_worker_behind_unless_it_still_holds_jobs(client):
    """A worker that stops cleanly drops its heartbeat and its name from the set of workers (a persistent Redis, like
    the demo's, listed every stopped worker); one that still has a job recorded as running stays listed until the
    reaper has put that job back in line."""
    from worker.heartbeat import withdraw

    beat(client, "idle@x")
    withdraw(client.r, client.keys, "idle@x")
    assert client.r.exists(client.keys.heartbeat("idle@x")) == 0
    assert client.r.sismember(client.keys.workers, "idle@x") == 0

    conv = client.new_conversation("ann")
    job = client.submit_turn("ann", conv, "hi")
    beat(client, "busy@x")
    assert client.dispatch() == 1 and claim(client, job, "busy@x") == 1
    withdraw(client.r, client.keys, "busy@x")
    assert client.r.sismember(client.keys.workers, "busy@x") == 1, "its job must still be found by the reaper"
    assert client.reaper.sweep()["requeued"] == 1
    assert client.r.sismember(client.keys.workers, "busy@x") == 0


def test_a_sweep_puts_back_only_what_it_saw_lost(client):
    """A sweep reads what looks lost, then acts: a dispatch it saw unclaimed that a worker started meanwhile, or a job
    of a worker it saw dead that now runs elsewhere, stays where it is (REQUEUE's only_state / only_worker)."""
    beat(client, "w1@x", capacity=2)
    job = client.submit_turn("ann", client.new_conversation("ann"), "hi")
    assert client.job_state(job) == "dispatched"
    assert claim(client, job, "w1@x") == 1  # started between the sweep's look and its act
    assert client.jobs.requeue(job, "lost", only_state="dispatched") == 0
    assert client.jobs.requeue(job, "lost", only_worker="w2@x") == 0, "not on the worker seen dead"
    assert client.job_state(job) == "started"
    assert client.jobs.requeue(job, "lost", only_worker="w1@x") == 1
    assert client.job_state(job) == "queued"


def test_a_job_that_comes_back_to_the_worker_answering_it_is_left_to_that_thread():
    """A worker presumed lost (its heartbeat late on an overloaded host) may get its own running job again: the second
    thread to hold it lets the first end it, instead of asking the engine for a request it already runs."""
    import threading

    from worker.serving.runtime import WorkerRuntime

    holder = WorkerRuntime.__new__(WorkerRuntime)  # only its bookkeeping of held jobs is used here
    holder._lock, holder._held = threading.Lock(), set()
    assert holder.hold("j1") is True
    assert holder.hold("j1") is False
