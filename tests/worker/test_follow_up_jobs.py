"""A follow-up's job carries its question alone; its history is the conversation's turns before it, which the script
that starts the job returns with the payload (``worker.store.jobs``). Whichever way it starts (a worker taking its
next job, or CLAIM of a job Celery carried), the worker's messages are exactly the conversation the client saw, the
job costs the same bytes however long the conversation, and a conversation that changed under it is refused in a
sentence rather than answered from other turns."""
from __future__ import annotations

import json

import pytest

from worker.errors import InvalidInput
from worker.queue.prefix_routes import job_route_keys
from worker.store.conversation_index import as_messages
from worker.store.history import turn_json
from worker.store.jobs import HISTORY_IN_CONVERSATION, Message, parse_job
from worker.store.keys import JobField, JobState

WORKER = "w@host"


def answered(client, user: str, conv: str | None, question: str, answer: str) -> str:
    """One turn asked, started on WORKER and answered; returns the conversation."""
    sub = client.submit(user, conv, question)
    taken = client.jobs.take(4, 4, WORKER)
    assert taken.job == sub.job and taken.started is not None
    client.jobs.finish(sub.job, JobState.done, holder=WORKER, text=answer,
                       answer_turn=turn_json("assistant", answer, job_id=sub.job))
    return sub.conv


def stored_payload(client, job: str) -> dict:
    return json.loads(client.r.hget(client.keys.job(job), JobField.payload))


def test_a_follow_up_carries_its_question_and_its_worker_reads_the_conversation(client):
    conv = None
    for i in range(6):
        conv = answered(client, "ann", conv, f"question {i}: what is in it?", f"answer {i}: " + "x" * 300)
    seen = [(m.role, m.text, m.image_sha) for m in as_messages(client.history("ann", conv))]
    follow_up = client.submit("ann", conv, "and after that?")
    payload = stored_payload(client, follow_up.job)
    assert payload[HISTORY_IN_CONVERSATION] is True and payload["turn"] is None, "SUBMIT gives it its turn"
    assert [m["text"] for m in payload["messages"]] == ["and after that?"], "its question alone"
    assert job_route_keys(client.r.hget(client.keys.job(follow_up.job), JobField.payload)) == [], \
        "a follow-up is routed to its conversation's holder, never by a first question's prefix"
    # a worker taking its next job itself: the history comes with the start, in the same round trip
    taken = client.jobs.take(4, 4, WORKER)
    assert taken.job == follow_up.job and taken.started is not None and taken.started.turn == 12
    job = parse_job(taken.started.payload, 64, 32_000, history=taken.started.history, turn=taken.started.turn)
    assert [(m.role, m.text, m.image_sha) for m in job.messages] == seen + [("user", "and after that?", None)]


def test_a_follow_up_celery_carried_gets_its_history_from_claim(client, fake_capacity):
    conv = answered(client, "bea", None, "what colour?", "red")
    fake_capacity(4)  # a worker's free slots: the follow-up is dispatched through Celery, not started
    follow_up = client.submit("bea", conv, "and the shape?")
    client.dispatch()
    assert client.job_state(follow_up.job) == JobState.dispatched
    n = int(client.r.hget(client.keys.job(follow_up.job), JobField.dispatch_n))
    started = client.jobs.claim(follow_up.job, n, WORKER)
    assert started.turn == 2
    job = parse_job(started.payload, 64, 32_000, history=started.history, turn=started.turn)
    assert [(m.role, m.text) for m in job.messages] == [("user", "what colour?"), ("assistant", "red"),
                                                        ("user", "and the shape?")]


def test_a_first_question_carries_its_earlier_messages_so_it_can_be_routed(client):
    """A stateless client's first request holds no answer: its job carries every message, so the dispatcher can send
    it to a worker holding the same prompt; its first answer's follow-up then carries its question alone."""
    asked = [Message("system", "Be brief."), Message("user", "What is a heron?")]
    first = client.submit_messages("api", asked)
    payload = stored_payload(client, first.job)
    assert HISTORY_IN_CONVERSATION not in payload and [m["role"] for m in payload["messages"]] == ["system", "user"]
    assert job_route_keys(client.r.hget(client.keys.job(first.job), JobField.payload))
    client.jobs.finish(first.job, JobState.done, text="a bird",
                       answer_turn=turn_json("assistant", "a bird", job_id=first.job))
    nxt = client.submit_messages("api", asked + [Message("assistant", "a bird"), Message("user", "and?")])
    assert nxt.conv == first.conv and stored_payload(client, nxt.job)[HISTORY_IN_CONVERSATION] is True


def test_a_follow_ups_job_is_the_same_size_however_long_the_conversation(client):
    conv, sizes = None, []
    for i in range(12):
        sub = client.submit("cy", conv, "the same question")
        sizes.append(len(client.r.hget(client.keys.job(sub.job), JobField.payload)))
        conv = sub.conv
        client.jobs.take(4, 4, WORKER)
        client.jobs.finish(sub.job, JobState.done, holder=WORKER, text="y" * 500,
                           answer_turn=turn_json("assistant", "y" * 500, job_id=sub.job))
    assert len(set(sizes[1:])) == 1, sizes  # (its turn is SUBMIT's, in the job's hash)


def test_a_conversation_that_changed_under_a_waiting_follow_up_is_refused_in_a_sentence():
    """Its worker reads the turns before the job's question as the start script found them; any other count than the
    payload's means the conversation is not the one the question was asked in."""
    question = {"job_id": "j", "user": "u", "conv": "c", "turn": 2, HISTORY_IN_CONVERSATION: True,
                "messages": [{"role": "user", "text": "and?", "image_sha": None}], "sampling": {}}
    earlier = [turn_json("user", "hi", job_id="a"), turn_json("assistant", "hello", job_id="a")]
    assert [m.text for m in parse_job(json.dumps(question), 64, 32_000, history=earlier).messages] == [
        "hi", "hello", "and?"]
    for history in (earlier[:1], earlier + [turn_json("user", "other tab")], None):
        with pytest.raises(InvalidInput, match="changed while your question waited"):
            parse_job(json.dumps(question), 64, 32_000, history=history)
    # a follow-up whose client read nothing: its turn is the one SUBMIT appended it as (``Started.turn``)
    unread = json.dumps({**question, "turn": None})
    assert [m.text for m in parse_job(unread, 64, 32_000, history=earlier, turn=2).messages] == ["hi", "hello", "and?"]
    with pytest.raises(InvalidInput, match="changed while your question waited"):
        parse_job(unread, 64, 32_000, history=earlier[:1], turn=2)
    with pytest.raises(InvalidInput, match="'turn' must be"):
        parse_job(unread, 64, 32_000, history=earlier)
    with pytest.raises(InvalidInput, match="question alone"):
        parse_job(json.dumps({**question, "messages": question["messages"] * 2}), 64, 32_000, history=earlier)
