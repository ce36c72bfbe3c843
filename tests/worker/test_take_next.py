"""A worker taking its next job itself: CLAIM's start data, FINISH taking the freed slot, POP with a worker.

The Redis side, with no worker process: ``JobStates.claim`` / ``take`` / ``finish_and_take`` against real Redis.
The worker side (the runner serving taken jobs, shutdown, failover) runs in tests/worker/test_worker_jobs.py and
test_worker_failover.py, with the setting on as shipped.
"""
from __future__ import annotations

import pytest

from worker.store.history import turn_json
from worker.store.keys import JobField, JobState, SlotsField

ME, OTHER = "me@test", "other@test"


def submit(client, user, text="hi", conv=None):
    conv = conv or client.new_conversation(user)
    return client.submit_turn(user, conv, text), conv


def start(client, job, worker=ME):
    """queued -> dispatched -> started on ``worker``, as a dispatch pass and a Celery delivery would."""
    popped = client.jobs.pop(10_000)
    assert popped is not None and popped[0] == job
    return client.jobs.claim(job, popped[1], worker)


def state(client, job):
    return client.job_state(job)


def test_claim_returns_what_the_runner_reads_to_start(client):
    job, conv = submit(client, "ann", "what is this?")
    client.r.hset(client.keys.job(job), JobField.group, "203.0.113.9")
    started = start(client, job)
    assert started.payload and b"what is this?" in started.payload
    assert (started.group, started.conv, started.owner, started.cancelled) == ("203.0.113.9", conv, "ann", False)
    assert state(client, job) == JobState.started
    assert client.r.sismember(client.keys.running(ME), job)
    assert client.jobs.claim(job, 1, ME) is None, "a second delivery of the same dispatch is refused"


def test_claim_reports_a_cancel_flag_set_before_the_job_started(client):
    job, _ = submit(client, "ann")
    client.r.set(client.keys.cancel(job), 1)
    assert start(client, job).cancelled


def test_finish_takes_the_next_job_in_the_fair_order_for_the_worker_that_freed_the_slot(client):
    heavy = [submit(client, "heavy", f"q{i}")[0] for i in range(3)]
    running = heavy[0]
    start(client, running)
    light, _ = submit(client, "light")
    # heavy has been served in this busy period: the light user's question is next, as POP would give it
    ended, taken = client.jobs.finish_and_take(running, JobState.done, only_state=JobState.started, only_worker=ME,
                                               take=(1, 1, ME))
    assert ended and taken.job == light and taken.started is not None and taken.started.owner == "light"
    assert state(client, light) == JobState.started
    assert client.r.hget(client.keys.job(light), JobField.worker).decode() == ME
    assert client.r.zcard(client.keys.inflight) == 1, "the slot the finish freed holds the taken job, no more"


def test_the_taken_job_gets_its_started_event(client):
    first, _ = submit(client, "ann")
    start(client, first)
    second, _ = submit(client, "bob")
    ended, taken = client.jobs.finish_and_take(first, JobState.done, take=(4, 4, ME))
    assert ended and taken.job == second
    entries = client.r.xrange(client.keys.stream(second))
    assert [e[b"type"].decode() for _, e in entries] == ["queued", "started"]


def test_finish_takes_nothing_when_nothing_waits_or_no_slot_is_free(client):
    first, _ = submit(client, "ann")
    start(client, first)
    assert client.jobs.finish_and_take(first, JobState.done, take=(4, 4, ME)) == (True, None)
    a, _ = submit(client, "dan")
    b, _ = submit(client, "eve")
    start(client, a)
    client.jobs.claim(b, client.jobs.pop(10_000)[1], OTHER)
    c, _ = submit(client, "cid")
    # capacity 1 with b still in flight: ending a frees no slot the capacity allows
    assert client.jobs.finish_and_take(a, JobState.done, take=(1, 1, ME)) == (True, None)
    assert state(client, c) == JobState.queued


def test_a_finish_that_ends_nothing_takes_nothing(client):
    first, _ = submit(client, "ann")
    start(client, first, worker=OTHER)
    waiting, _ = submit(client, "bob")
    assert client.jobs.finish_and_take(first, JobState.done, only_worker=ME, take=(4, 4, ME)) == (False, None)
    assert state(client, waiting) == JobState.queued and state(client, first) == JobState.started


def test_a_follow_up_held_by_another_worker_is_left_dispatched_for_it(client):
    job, conv = submit(client, "ann")
    start(client, job, worker=OTHER)
    client.jobs.finish(job, JobState.done, answer_turn=turn_json("assistant", "hello", job_id=job), holder=OTHER)
    follow_up = client.submit_turn("ann", conv, "and then?")
    taken = client.jobs.take(4, 4, ME)
    assert taken.job == follow_up and taken.started is None and taken.dispatch_n == 1
    assert state(client, follow_up) == JobState.dispatched, "dispatched, for FairDispatch.send to route"


def test_a_follow_up_this_worker_holds_is_taken_as_an_affinity_hit(client):
    job, conv = submit(client, "ann")
    start(client, job)
    client.jobs.finish(job, JobState.done, answer_turn=turn_json("assistant", "hello", job_id=job), holder=ME)
    follow_up = client.submit_turn("ann", conv, "and then?")
    taken = client.jobs.take(4, 4, ME)
    assert taken.job == follow_up and taken.started is not None and taken.affinity_hit
    fresh, _ = submit(client, "bob")
    other = client.jobs.take(4, 4, ME)
    assert other.job == fresh and other.started is not None and not other.affinity_hit


def test_finish_folds_the_run_time_into_the_service_average(client):
    earlier, _ = submit(client, "ann")
    start(client, earlier)
    assert client.jobs.finish(earlier, JobState.done, service_s=8.0)
    assert float(client.r.hget(client.keys.slots, SlotsField.service_s)) == 8.0, "the first run time is the average"
    first, _ = submit(client, "bob")
    start(client, first)
    assert client.jobs.finish(first, JobState.done, service_s=18.0)
    assert float(client.r.hget(client.keys.slots, SlotsField.service_s)) == 0.8 * 8.0 + 0.2 * 18.0
    assert not client.jobs.finish(first, JobState.done, service_s=100.0), "already ended: nothing folded in"
    assert float(client.r.hget(client.keys.slots, SlotsField.service_s)) == 0.8 * 8.0 + 0.2 * 18.0
    # a finish that takes the next job writes the average with the slot layout its take counted
    third, _ = submit(client, "cid")
    start(client, third)
    waiting, _ = submit(client, "dan")
    ended, taken = client.jobs.finish_and_take(third, JobState.done, service_s=28.0, take=(4, 4, ME))
    assert ended and taken.job == waiting
    slots = {k.decode(): float(v) for k, v in client.r.hgetall(client.keys.slots).items()}
    assert slots == {SlotsField.capacity: 4, SlotsField.shared: 4, SlotsField.light_from: 4,
                     SlotsField.service_s: pytest.approx(0.8 * (0.8 * 8.0 + 0.2 * 18.0) + 0.2 * 28.0)}


def test_a_taking_worker_first_starts_the_oldest_job_still_travelling_through_celery(client):
    """A job a dispatch pass sent to Celery was popped before any job still queued: the worker taking its next job
    starts it first (its Celery message then fails CLAIM), so no job popped later starts before it."""
    running, _ = submit(client, "ann")
    start(client, running)
    travelling, _ = submit(client, "bob")
    sent = client.jobs.pop(10_000)
    assert sent[0] == travelling and state(client, travelling) == JobState.dispatched
    held, _ = submit(client, "cid")
    client.jobs.pop(10_000)
    client.r.hset(client.keys.job(held), JobField.target, OTHER)  # sent to another worker's own queue: not taken
    queued, _ = submit(client, "dan")
    ended, taken = client.jobs.finish_and_take(running, JobState.done, take=(1, 1, ME))
    assert ended and taken.job == travelling and taken.started is not None
    assert state(client, travelling) == JobState.started and state(client, queued) == JobState.queued
    assert state(client, held) == JobState.dispatched
    assert client.jobs.claim(travelling, sent[1], OTHER) is None, "its Celery message is dropped when it arrives"
