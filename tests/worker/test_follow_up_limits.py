"""A follow-up's client reads nothing before SUBMIT: SUBMIT checks the conversation's owner and the history limits
(turns, characters, pictures) on the sums the conversation keeps in its hash, which every step that changes its turns
keeps exact (SUBMIT, FINISH, TRUNCATE). So a follow-up costs one round trip, like a first question."""
from __future__ import annotations

import dataclasses
import json

import pytest
import redis

from tests.worker.live import png
from worker import heartbeat
from worker.client import OwletClient
from worker.errors import InvalidInput, NotYourConversation
from worker.store.history import turn_json
from worker.store.jobs import TOO_LONG
from worker.store.keys import ConvField, JobState

WORKER = "w@host"


@pytest.fixture
def limited(settings):
    c = OwletClient(settings=dataclasses.replace(settings, history_max_turns=7, history_max_chars=60,
                                                 max_images_per_request=2))
    yield c
    c.close(purge=True)


def answer(client, job: str, text: str) -> None:
    client.jobs.take(4, 4, WORKER)
    assert client.jobs.finish(job, JobState.done, holder=WORKER, text=text,
                              answer_turn=turn_json("assistant", text, job_id=job))


def sums(client, conv: str) -> tuple[int, int]:
    chars, images = client.r.hmget(client.keys.conversation(conv), ConvField.chars, ConvField.images)
    return int(chars), int(images)


def counted(client, conv: str) -> tuple[int, int]:
    turns = [json.loads(t) for t in client.r.lrange(client.keys.turns(conv), 0, -1)]
    return sum(len(t["text"]) for t in turns), sum(1 for t in turns if t["image_sha"])


def test_a_follow_up_sends_one_command_its_submit(limited, monkeypatch):
    # a live worker with no free slot: the client reads the heartbeats once a second, not on every submit
    heartbeat.publish(limited.r, limited.keys, heartbeat.Heartbeat(WORKER, capacity=0), ttl_s=60)
    first = limited.submit("ann", None, "hi")
    answer(limited, first.job, "hello")
    sent = []
    real = redis.Redis.execute_command

    def recording(self, *args, **options):
        sent.append(args[0])
        return real(self, *args, **options)

    monkeypatch.setattr(redis.Redis, "execute_command", recording)
    limited.submit("ann", first.conv, "and then?")
    assert sent == ["FCALL"], sent


def test_the_limits_hold_for_follow_ups_in_characters_as_python_counts_them(limited):
    sub = limited.submit("ann", None, "é" * 20)  # 20 characters, 40 bytes
    answer(limited, sub.job, "ü" * 20)
    assert sums(limited, sub.conv) == (40, 0) == counted(limited, sub.conv)
    with pytest.raises(InvalidInput, match=TOO_LONG):
        limited.submit("ann", sub.conv, "x" * 21)  # 61 characters
    nxt = limited.submit("ann", sub.conv, "x" * 20)  # 60: at the limit
    answer(limited, nxt.job, "")
    assert sums(limited, sub.conv) == counted(limited, sub.conv) == (60, 0)
    with pytest.raises(InvalidInput, match=TOO_LONG):
        limited.submit("ann", sub.conv, "y")


def test_the_turn_limit_counts_every_turn(limited):
    conv = None
    for i in range(3):  # 6 turns
        sub = limited.submit("bea", conv, f"q{i}")
        conv = sub.conv
        answer(limited, sub.job, f"a{i}")
    last = limited.submit("bea", conv, "q3")  # the 7th
    answer(limited, last.job, "a3")
    with pytest.raises(InvalidInput, match=TOO_LONG):
        limited.submit("bea", conv, "q4")
    assert limited.history("bea", conv)[-1]["text"] == "a3", "nothing was written"


def test_the_sums_stay_exact_through_a_truncate_and_a_conversation_kept_by_an_earlier_version(limited):
    sha = limited.put_image(png())
    sub = limited.submit("cy", None, "what is it? 🦩", image_sha=sha)  # 13 characters, 16 bytes
    answer(limited, sub.job, "a picture of a heron")
    nxt = limited.submit("cy", sub.conv, "and this?", image_sha=sha)
    answer(limited, nxt.job, "the same heron")
    assert sums(limited, sub.conv) == counted(limited, sub.conv) == (56, 2)
    with pytest.raises(InvalidInput, match="already holds 2 images"):
        limited.submit("cy", sub.conv, "3rd?", image_sha=sha)  # 60 characters: within that limit
    limited.truncate("cy", sub.conv, 2)  # an edit of the second question: TRUNCATE counts in Lua what Python did
    assert sums(limited, sub.conv) == counted(limited, sub.conv) == (33, 1)
    # a conversation an earlier version kept has no sums: SUBMIT counts its turns once, then keeps them
    limited.r.hdel(limited.keys.conversation(sub.conv), ConvField.chars, ConvField.images)
    with pytest.raises(InvalidInput, match=TOO_LONG):
        limited.submit("cy", sub.conv, "z" * 30)
    again = limited.submit("cy", sub.conv, "and now?", image_sha=sha)
    assert sums(limited, sub.conv) == counted(limited, sub.conv) == (41, 2)
    answer(limited, again.job, "yes")
    assert sums(limited, sub.conv) == counted(limited, sub.conv) == (44, 2)


def test_another_identitys_conversation_is_still_refused_without_a_read(limited):
    sub = limited.submit("dan", None, "mine")
    answer(limited, sub.job, "yours")
    with pytest.raises(NotYourConversation):
        limited.submit("eve", sub.conv, "let me in")
    with pytest.raises(NotYourConversation):
        limited.submit("eve", "no-such-conversation", "or here")
