"""Stateless turns (``OwletClient.submit_messages``, what the OpenAI-compatible API uses), on a real Redis without a
worker: the earlier messages continue the identity's stored conversation they equal, or start a new one holding
them all; never another identity's; nothing is stored for a refused turn."""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json

import pytest
from PIL import Image

from worker.client import ONE_NEW_PICTURE, OwletClient
from worker.store.conversation_index import digest
from worker.errors import ConversationBusy, InvalidInput, RateLimited
from worker.store.history import turn_json
from worker.store.jobs import Job, Message, parse_job
from worker.store.keys import JobField


def picture(colour=(200, 30, 30)) -> tuple[str, bytes]:
    out = io.BytesIO()
    Image.new("RGB", (32, 24), colour).save(out, format="PNG")
    data = out.getvalue()
    return hashlib.sha256(data).hexdigest(), data


def answer(client: OwletClient, job: str, text: str) -> None:
    """End ``job`` as a worker would, with ``text`` as its answer."""
    assert client.jobs.finish(job, "done", answer_turn=turn_json("assistant", text, job_id=job), text=text)


def payload(client: OwletClient, job: str) -> Job:
    """The job as its worker reads it: its payload, and (a follow-up's history) the conversation's turns before it."""
    raw, conv, turn = client.r.hmget(client.keys.job(job), JobField.payload, JobField.conv, JobField.turn)
    history = client.r.lrange(client.keys.turns(conv.decode()), 0, int(turn) - 1) if int(turn) else []
    return parse_job(raw, 64, 32_000, history=history)


def stored(client: OwletClient, user: str, conv: str) -> list[tuple]:
    return [(t["role"], t["text"], t["image_sha"]) for t in client.history(user, conv)]


def test_a_follow_up_continues_the_conversation_its_earlier_messages_equal(client):
    sha, data = picture()
    first = [Message("system", "Be brief."), Message("user", "What colour?", sha)]
    one = client.submit_messages("anon:a", first, {sha: data}, group="addr:1")
    answer(client, one.job, "red")
    two = client.submit_messages("anon:a", first + [Message("assistant", "red"), Message("user", "Where?", sha)],
                                 {sha: data}, group="addr:1")
    assert two.conv == one.conv, "the stored conversation is continued, so its session cache can serve it"
    assert stored(client, "anon:a", one.conv) == [("system", "Be brief.", None), ("user", "What colour?", sha),
                                                 ("assistant", "red", None), ("user", "Where?", sha)]
    job = payload(client, two.job)
    assert job.turn == 3 and job.conv == one.conv and [m.role for m in job.messages][-1] == "user"


def test_a_whole_history_nobody_stored_starts_a_new_conversation_holding_all_of_it(client):
    sha, data = picture((20, 20, 220))
    messages = [Message("user", "What is it?", sha), Message("assistant", "a square"), Message("user", "Colour?")]
    sub = client.submit_messages("anon:b", messages, {sha: data}, group="addr:1")
    assert stored(client, "anon:b", sub.conv) == [(m.role, m.text, m.image_sha) for m in messages]
    assert client.r.get(client.keys.image(sha)) == data, "the picture an earlier message names is stored with it"
    assert payload(client, sub.job).turn == 2
    assert client.r.get(client.keys.newest_conversation("anon:b")) is None, "the page never reopens API chats"


def test_an_edited_answer_another_key_or_an_answer_in_progress_start_afresh(client):
    first = [Message("user", "Hello?")]
    one = client.submit_messages("anon:c", first, group="addr:1")
    pending = client.submit_messages("anon:c", first + [Message("user", "Still there?")], group="addr:1")
    assert pending.conv != one.conv, "its answer is still being made: not continued, and not refused as busy"
    answer(client, one.job, "hi")
    edited = client.submit_messages("anon:c", first + [Message("assistant", "HI"), Message("user", "And?")],
                                     group="addr:1")
    assert edited.conv != one.conv, "an answer the client changed is not what the conversation holds"
    other = client.submit_messages("anon:d", first + [Message("assistant", "hi"), Message("user", "And?")],
                                   group="addr:1")
    assert other.conv != one.conv, "never another identity's conversation"
    same = client.submit_messages("anon:c", first + [Message("assistant", "hi"), Message("user", "And?")],
                                  group="addr:1")
    assert same.conv == one.conv


def test_a_conversation_changed_since_it_matched_is_not_continued(client):
    one = client.submit_messages("anon:e", [Message("user", "Hello?")], group="addr:1")
    answer(client, one.job, "hi")
    job = Job("j-race", "anon:e", one.conv, 2, (Message("user", "Hello?"), Message("assistant", "hi"),
                                               Message("user", "x")), {})
    with pytest.raises(ConversationBusy):  # it holds 2 turns, not the 3 the caller matched
        client.jobs.enqueue(job, turn_json("user", "x", job_id="j-race"), group="addr:1", expect_turns=3)
    assert len(client.history("anon:e", one.conv)) == 2 and client.job_state("j-race") is None


def test_two_pictures_the_server_does_not_hold_are_refused_and_nothing_is_stored(client):
    (sha1, data1), (sha2, data2) = picture((1, 2, 3)), picture((4, 5, 6))
    messages = [Message("user", "This?", sha1), Message("assistant", "ok"), Message("user", "And this?", sha2)]
    with pytest.raises(InvalidInput) as refused:
        client.submit_messages("anon:f", messages, {sha1: data1, sha2: data2}, group="addr:1")
    assert refused.value.user_message == ONE_NEW_PICTURE
    assert not list(client.r.scan_iter(match=client.keys.prefix + "*", count=1000)), "nothing stored"


def test_the_index_is_per_identity_and_names_what_was_sent(client):
    messages = [Message("user", "Hello?")]
    sub = client.submit_messages("anon:g", messages, group="addr:1")
    assert client.r.get(client.keys.chat_index("anon:g", digest(messages))).decode() == sub.conv
    assert client.r.ttl(client.keys.chat_index("anon:g", digest(messages))) > 0, "it expires with the history"
    assert client.r.get(client.keys.chat_index("anon:h", digest(messages))) is None


def test_a_rate_limit_says_when_to_come_back(settings):
    client = OwletClient(settings=dataclasses.replace(settings, group_submit_limit=1, group_submit_window_s=60))
    try:
        client.submit_messages("anon:i", [Message("user", "one")], group="addr:9")
        with pytest.raises(RateLimited) as refused:
            client.submit_messages("anon:i", [Message("user", "two")], group="addr:9")
        assert 0 < refused.value.retry_after_s <= 60
    finally:
        client.close(purge=True)


def test_the_stored_turns_are_what_a_worker_reads(client):
    sha, data = picture((9, 9, 9))
    sub = client.submit_messages("anon:j", [Message("system", "s"), Message("user", "", sha)], {sha: data},
                                 group="addr:1")
    raw = json.loads(client.r.hget(client.keys.job(sub.job), JobField.payload))
    assert [m["role"] for m in raw["messages"]] == ["system", "user"] and raw["messages"][1]["image_sha"] == sha


@pytest.mark.parametrize("where", ["question", "earlier message", "stop sequence", "page question"])
def test_text_with_an_unpaired_surrogate_is_refused_in_a_sentence_and_nothing_is_stored(client, where):
    """A JSON body can carry a lone UTF-16 surrogate as "\\ud800" (and a browser's text box can hold one); it has no
    UTF-8 form, so nothing can store it: the turn is refused, saying what and where, not failed as an internal
    error."""
    bad = "Is it red?\ud800"
    question, earlier, sampling = "Is it red?", [], None
    if where in ("question", "page question"):
        question = bad
    elif where == "earlier message":
        earlier = [Message("system", "Answer briefly.\udc01")]
    else:
        sampling = {"stop": [".", "\ud83d"]}
    with pytest.raises(InvalidInput) as refused:
        if where == "page question":
            client.submit("anon:s", None, question, sampling=sampling, group="addr:1")
        else:
            client.submit_messages("anon:s", [*earlier, Message("user", question)], sampling=sampling, group="addr:1")
    said = {"question": "Your question", "page question": "Your question", "earlier message": "Message 1",
            "stop sequence": "A stop sequence"}[where]
    assert refused.value.user_message.startswith(f"{said} holds a character that is not text"), refused.value
    assert "U+D8" in refused.value.user_message or "U+DC01" in refused.value.user_message
    assert not list(client.r.scan_iter(match=client.keys.prefix + "*", count=1000)), "nothing stored"
    # the same turn without the stray half of a character is served as usual (an emoji is a whole pair: fine)
    ok = client.submit_messages("anon:s", [Message("user", "Is it red? \U0001F534")], sampling={"stop": ["."]},
                                group="addr:1")
    assert client.job_state(ok.job) == "queued"
