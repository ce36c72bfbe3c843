"""The service-wide history budget on a small Redis of its own (a few MB of ``maxmemory``, ``noeviction``, as compose
runs it), filled through the real path: the client's SUBMIT as the page calls it, FINISH as the worker calls it.
New visitors are always admitted; the least recently used conversations gave way whole (every key of theirs); and
nothing is left half-written: what the budget counts is exactly what Redis holds."""
from __future__ import annotations

import io
import random

import pytest
import redis
from PIL import Image

from tests.redis_server import small_redis
from worker.store import memory_model as mm
from worker.client import OwletClient
from worker.config import Settings
from worker.errors import ConversationCleared, NotYourConversation
from worker.store.history import turn_json
from worker.store.history_budget import UNLIMITED_REDIS_BUDGET, history_budget
from worker.store.jobs import Message
from worker.store.keys import ConvField, JobField, JobState

pytestmark = pytest.mark.timeout(300)
MB = 1024 * 1024
OPEN = dict(user_queue_cap=10_000, global_queue_cap=100_000, group_job_cap=100_000, group_submit_limit=10**6)


def picture(seed: int) -> bytes:
    """A photo-like picture: about 12 KB of PNG."""
    rng = random.Random(seed)
    out = io.BytesIO()
    Image.frombytes("RGB", (64, 64), rng.randbytes(64 * 64 * 3)).save(out, format="PNG")
    return out.getvalue()


def visit(client: OwletClient, i: int, turns: int = 3, answer: int = 1200, pictures: bool = True) -> str:
    """Conversation ``i``: a picture (or not) and a question, then follow-ups, each answered as the worker answers
    (FINISH with the answer and the holder). Forty visitors behind twelve addresses start one after another. Returns the
    conversation."""
    conv = None
    for t in range(turns):
        sub = client.submit(owner(i), conv, f"question {t}: what is in it?", group=f"10.0.0.{i % 12}",
                            image=picture(i) if t == 0 and pictures else None)
        conv = sub.conv
        text = f"answer {i}.{t} " + "a" * answer
        assert client.jobs.finish(sub.job, JobState.done, holder="worker@host", text=text,
                                  answer_turn=turn_json("assistant", text, job_id=sub.job))
    return conv


def owner(i: int) -> str:
    return f"visitor{i % 40}"


def oom_refusals(r: redis.Redis) -> int:
    return int(r.info("errorstats").get("errorstat_OOM", {}).get("count", 0))


def check_whole_and_counted(client: OwletClient, convs: list[str], turns: int) -> list[str]:
    """The conversations that gave way are the oldest ones, gone whole, each leaving its owner a notice; the others
    are complete; and the budget counts exactly what is held. Returns the ones that gave way."""
    r, k = client.r, client.keys
    gone = [conv for conv in convs if not r.exists(k.conversation(conv))]
    assert gone == convs[:len(gone)], "the least recently used gave way first"
    for i, conv in enumerate(convs):
        if conv in gone:
            assert not r.exists(k.turns(conv), k.holder(conv), k.chat_indexes_of(conv)), "gone whole"
            assert r.get(k.newest_conversation(owner(i))) != conv.encode()
            assert r.get(k.cleared(conv)) == owner(i).encode(), "its owner is told why"
            with pytest.raises(ConversationCleared):
                client.history(owner(i), conv)
            with pytest.raises(NotYourConversation) as other:
                client.history("someone-else", conv)
            assert type(other.value) is NotYourConversation, "only its owner learns it existed"
        else:
            stored = client.history(owner(i), conv)
            assert [t["role"] for t in stored] == ["user", "assistant"] * turns, "nothing half-written"
            assert r.hget(k.conversation(conv), ConvField.pending) is None
    held = {c.decode() for c in r.zrange(k.conversations_held, 0, -1)}
    sizes = {c.decode(): int(v) for c, v in r.hgetall(k.conversation_sizes).items()}
    assert held == set(sizes) == set(convs) - set(gone)
    for conv in held:  # each charged what the model says it holds
        stored = r.lrange(k.turns(conv), 0, -1)
        assert sizes[conv] == mm.CONVERSATION_BYTES + sum(len(t) + mm.TURN_BYTES for t in stored)
    notices = r.zcard(k.cleared_held)
    assert notices == len(gone)
    assert int(r.get(k.history_total)) == sum(sizes.values()) + notices * mm.CLEARED_BYTES
    # no job or stream of a cleared conversation is left
    for key in r.scan_iter(match=k.job("*")):
        conv = r.hget(key, JobField.conv)  # None: the job's hash expired since the scan named it
        assert conv is None or conv.decode() not in gone
    return gone


def test_the_budget_keeps_a_small_redis_under_maxmemory_by_giving_way_oldest_first(tmp_path):
    """The default budget, from maxmemory: conversations past it give way before Redis is full, so Redis never
    refuses a write (its OOM error count stays 0) and every visitor is admitted. (Jobs live a few seconds here, so
    that what fills Redis is conversations; text only, pictures having a total of their own.)"""
    with small_redis(tmp_path, 16 * MB) as url:
        settings = Settings.from_env(redis_url=url, key_prefix="b:", stream_ttl_s=1, queue_timeout_s=1,
                                     job_deadline_s=1, **OPEN)
        client = OwletClient(settings=settings)
        budget = client.jobs.history_budget
        assert budget == 2 * MB, "an eighth of a maxmemory smaller than the pictures' total"
        convs = []
        while not convs or client.r.exists(client.keys.conversation(convs[0])):
            convs.append(visit(client, len(convs), pictures=False))
        for _ in range(len(convs)):  # as many again: half of them must give way
            convs.append(visit(client, len(convs), pictures=False))
        gone = check_whole_and_counted(client, convs, turns=3)
        assert len(gone) >= len(convs) // 2
        assert int(client.r.get(client.keys.history_total)) <= budget
        assert oom_refusals(client.r) == 0, "Redis never reached its maxmemory"
        client.close()


def test_a_full_redis_makes_room_and_still_admits_new_visitors(tmp_path):
    """With a budget larger than Redis (set outright), Redis itself fills up (jobs and streams live an hour): SUBMIT
    is refused whole, MAKE_ROOM clears the least recently used conversations, and the turn is admitted."""
    with small_redis(tmp_path, 4 * MB) as url:
        settings = Settings.from_env(redis_url=url, key_prefix="f:", history_total_bytes=1024 * MB, **OPEN)
        client = OwletClient(settings=settings)
        convs = []
        while oom_refusals(client.r) < 3 or len(convs) < 100:
            convs.append(visit(client, len(convs)))
            assert len(convs) < 5000, "Redis never filled up"
        for _ in range(100):  # and on, past the full point
            convs.append(visit(client, len(convs)))
        gone = check_whole_and_counted(client, convs, turns=3)
        assert gone, "old conversations made room"
        used, limit = client.r.info("memory")["used_memory"], 4 * MB
        assert used <= limit * 1.05, used
        client.close()


def test_a_conversation_being_answered_never_gives_way(tmp_path):
    with small_redis(tmp_path, 64 * MB) as url:
        settings = Settings.from_env(redis_url=url, key_prefix="l:", history_total_bytes=30_000, **OPEN)
        client = OwletClient(settings=settings)
        waiting = client.submit("first", None, "still being answered", group="a")  # its job never ends
        convs = [visit(client, i) for i in range(40)]
        assert client.history("first", waiting.conv)[0]["text"] == "still being answered"
        gone = [c for c in convs if not client.r.exists(client.keys.conversation(c))]
        assert gone == convs[:len(gone)] and len(gone) > 20
        client.close()


def test_an_api_conversation_that_gave_way_starts_again_from_the_messages(tmp_path):
    """A stateless client sends every message again: once its conversation gave way (index entries and all), the
    next request starts a new one holding them, and is answered like any other."""
    with small_redis(tmp_path, 64 * MB) as url:
        settings = Settings.from_env(redis_url=url, key_prefix="a:", history_total_bytes=40_000, **OPEN)
        client = OwletClient(settings=settings)
        asked = [Message("user", "what is a heron?")]
        first = client.submit_messages("api", asked, group="api-addr")
        client.jobs.finish(first.job, JobState.done, text="a bird",
                           answer_turn=turn_json("assistant", "a bird", job_id=first.job))
        assert client.r.scard(client.keys.chat_indexes_of(first.conv)) == 1
        for i in range(40):
            visit(client, i)
        assert not client.r.exists(client.keys.conversation(first.conv)), "it gave way"
        assert not list(client.r.scan_iter(match=client.keys.chat_index("api", "*"))), "with its index entries"
        again = client.submit_messages("api", asked + [Message("assistant", "a bird"), Message("user", "and?")],
                                       group="api-addr")
        assert again.conv != first.conv
        assert [t["text"] for t in client.history("api", again.conv)] == ["what is a heron?", "a bird", "and?"]
        client.close()


def test_the_default_budget_comes_from_maxmemory():
    s = Settings()
    assert history_budget(s, 2 * 1024 * MB) == 512 * MB, "compose: maxmemory 2gb, 1 GiB of pictures"
    assert history_budget(s, 0) == UNLIMITED_REDIS_BUDGET
    assert history_budget(s, 64 * MB) == 8 * MB, "an eighth of a Redis smaller than the pictures' total"
    assert history_budget(Settings(history_total_bytes=1234), 2 * 1024 * MB) == 1234


def test_a_conversation_gives_way_with_its_own_jobs_only(tmp_path):
    """Its ended jobs' hashes and streams go with it, named by its turns; a question naming another job's id in its
    text takes nothing of anyone else's."""
    with small_redis(tmp_path, 64 * MB) as url:
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix="j:", **OPEN))
        other = client.submit("bob", None, "bob's question", group="b")
        client.jobs.finish(other.job, JobState.done, text="x",
                           answer_turn=turn_json("assistant", "x", job_id=other.job))
        sly = client.submit("eve", None, f'"job_id": "{other.job}"}}', group="e")
        client.jobs.finish(sly.job, JobState.done, text="y", answer_turn=turn_json("assistant", "y", job_id=sly.job))
        bobs = client.r.zscore(client.keys.conversations_held, other.conv)
        client.r.zadd(client.keys.conversations_held, {sly.conv: bobs - 1}, xx=True)  # eve's is the older now
        scripts = client.jobs._scripts
        assert scripts.call(scripts.make_room, room_bytes=1, keep="") > 0  # MAKE_ROOM for one byte: the oldest goes
        assert not client.r.exists(client.keys.conversation(sly.conv), client.keys.job(sly.job),
                                   client.keys.stream(sly.job)), "eve's conversation went with its job and stream"
        assert client.r.exists(client.keys.job(other.job)) and client.r.exists(client.keys.stream(other.job))
        client.close()


def charge_is_exact(client: OwletClient, conv: str, reserved: int = 0) -> None:
    """``conv`` is charged exactly what it holds (and ``reserved``: a live job's answer, at its longest), and the
    total is the sum of every charge."""
    r, k = client.r, client.keys
    stored = r.lrange(k.turns(conv), 0, -1)
    held = mm.CONVERSATION_BYTES + sum(len(t) + mm.TURN_BYTES for t in stored)
    held += r.scard(k.chat_indexes_of(conv)) * mm.INDEX_ENTRY_BYTES
    assert int(r.hget(k.conversation_sizes, conv)) == held + reserved
    sizes = [int(v) for v in r.hvals(k.conversation_sizes)]
    assert int(r.get(k.history_total)) == sum(sizes) + r.zcard(k.cleared_held) * mm.CLEARED_BYTES


def test_a_retry_or_an_edit_keeps_the_charge_exact_so_a_follow_up_is_charged_without_reading_its_turns(tmp_path):
    """SUBMIT charges a follow-up from the conversation's charge alone, so every change to what a conversation holds
    keeps that charge exact: FINISH (its answer), and TRUNCATE (a retry or an edit drops later turns), also while
    the dropped question's answer is still being generated (its reserve stays until its worker ends it, cancelled,
    appending nothing). An API conversation's index entries are charged too."""
    with small_redis(tmp_path, 64 * MB) as url:
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix="t:", **OPEN))
        conv = visit(client, 0, turns=3, pictures=False)
        charge_is_exact(client, conv)
        client.truncate(owner(0), conv, 3)  # an edit of the second question drops it and what follows
        assert len(client.history(owner(0), conv)) == 3
        charge_is_exact(client, conv)
        # a follow-up is charged from that charge: exact after its answer
        sub = client.submit(owner(0), conv, "asked again", group="10.0.0.0")
        text = "a new answer " + "b" * 500
        client.jobs.finish(sub.job, JobState.done, holder="worker@host", text=text,
                           answer_turn=turn_json("assistant", text, job_id=sub.job))
        charge_is_exact(client, conv)
        # a retry while the answer is being generated: it is cancelled on its worker, and its reserve stays charged
        # until that worker ends it
        running = client.submit(owner(0), conv, "one more", group="10.0.0.0")
        taken = client.jobs.take(1, 1, "worker@host")
        assert taken.job == running.job and taken.started is not None
        reserve = int(client.r.hget(client.keys.job(running.job), JobField.reserved))
        client.truncate(owner(0), conv, 4)
        assert client.job_state(running.job) == JobState.started, "its worker ends it"
        charge_is_exact(client, conv, reserved=reserve)
        client.jobs.finish(running.job, JobState.cancelled, holder="worker@host", text="partial",
                           answer_turn=turn_json("assistant", "partial", job_id=running.job))
        assert len(client.history(owner(0), conv)) == 4, "nothing appended after its question was dropped"
        charge_is_exact(client, conv)
        client.truncate(owner(0), conv, 0)
        charge_is_exact(client, conv)
        # an API conversation: its index entry is part of the charge
        asked = [Message("user", "what is a heron?")]
        first = client.submit_messages("api", asked, group="api-addr")
        client.jobs.finish(first.job, JobState.done, text="a bird",
                           answer_turn=turn_json("assistant", "a bird", job_id=first.job))
        nxt = client.submit_messages("api", asked + [Message("assistant", "a bird"), Message("user", "and?")],
                                     group="api-addr")
        assert nxt.conv == first.conv
        client.jobs.finish(nxt.job, JobState.done, text="grey",
                           answer_turn=turn_json("assistant", "grey", job_id=nxt.job))
        assert client.r.scard(client.keys.chat_indexes_of(first.conv)) == 2
        charge_is_exact(client, first.conv)
        client.close()
