"""The Redis memory model (``worker.store.memory_model``, docs/redis_memory.md) holds: real keys, made through the real
path (the client's SUBMIT, the runner's stream writer, FINISH as the worker calls it), measured with Redis's
``MEMORY USAGE``, take what the model says within its tolerance; and the document quotes the model's figures."""
from __future__ import annotations

import hashlib
import io
import random
import re
from pathlib import Path

import pytest
from PIL import Image

from tests.redis_server import unique_prefix
from worker.store import memory_model as mm
from worker.client import OwletClient
from worker.config import Settings
from worker.store.history import turn_json
from worker.store.jobs import Message
from worker.store.keys import ConvField, JobField
from worker.store.streams import StreamWriter

ROOT = Path(__file__).resolve().parents[2]
N = 200  # conversations a shape is measured over: the bookkeeping zsets and hashes past their compact encodings
UNLIMITED = dict(user_queue_cap=10_000, global_queue_cap=100_000, group_job_cap=100_000, group_submit_limit=10**6,
                 text_quota_user_bytes=10**12, text_quota_group_bytes=10**12, image_quota_user_bytes=10**12,
                 image_quota_group_bytes=10**12)
CONVERSATION_KEYS = ("conv:", "holder:", "newest:", "chatidx", "convs_held", "conv_sizes")


@pytest.fixture
def client(redis_url):
    c = OwletClient(settings=Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("mem"), **UNLIMITED))
    yield c
    c.close(purge=True)


def usage(client: OwletClient, *starts: str) -> int:
    """MEMORY USAGE (exact: every element counted) of the client's keys whose names start with one of ``starts``."""
    prefix = client.keys.prefix
    return sum(client.r.memory_usage(key, samples=0) or 0 for key in client.r.scan_iter(match=prefix + "*", count=1000)
               if key.decode()[len(prefix):].startswith(starts))


def converse(client: OwletClient, n: int, turns: int, question: int, answer: int, api: bool) -> None:
    """``n`` conversations of ``turns`` answered questions each, as the page (or the API) and a worker make them."""
    for i in range(n):
        conv, messages = None, []
        for t in range(turns):
            q = f"question {i}.{t} " + "q" * question
            if api:
                messages.append(Message("user", q))
                sub = client.submit_messages(f"user{i}", messages, group=f"addr{i % 40}")
            else:
                sub = client.submit(f"user{i}", conv, q, group=f"addr{i % 40}")
            conv, text = sub.conv, "a" * answer
            assert client.jobs.finish(sub.job, "done", answer_turn=turn_json("assistant", text, job_id=sub.job),
                                      holder="worker@host", text=text)
            messages.append(Message("assistant", text))


@pytest.mark.parametrize("turns, question, answer, api", [
    (1, 40, 400, False),  # one question about a picture, on the page
    (5, 40, 600, False),  # a picture and four follow-ups
    (3, 60, 500, True),  # an API client's conversation (an index entry a question)
    (2, 2000, 4000, False),  # long questions and answers: the allocator's size classes show most here
])
def test_a_conversation_takes_what_the_budget_charges_it(client, turns, question, answer, api):
    converse(client, N, turns, question, answer, api)
    measured = usage(client, *CONVERSATION_KEYS)
    charged = int(client.r.get(client.keys.history_total))
    print(f"{turns} turns, {question}/{answer} chars, api={api}: {measured / N:.0f} B measured, "
          f"{charged / N:.0f} B charged a conversation")
    assert abs(charged / measured - 1) <= mm.TOLERANCE


def test_a_conversation_left_with_new_conversation_still_takes_what_the_budget_charges_it(client):
    """LEAVE adds the time it was left to the conversation's hash, once: a one-question chat, the smallest a field
    weighs most in, stays within the charge."""
    import time

    converse(client, N, 1, 40, 400, False)
    convs = [conv.decode() for conv in client.r.hkeys(client.keys.conversation_sizes)]
    assert len(convs) == N
    for conv in convs:
        owner = client.r.hget(client.keys.conversation(conv), ConvField.user).decode()
        assert client.leave(owner, conv, time.time())
    measured = usage(client, *CONVERSATION_KEYS)
    charged = int(client.r.get(client.keys.history_total))
    print(f"left: {measured / N:.0f} B measured, {charged / N:.0f} B charged a conversation")
    assert abs(charged / measured - 1) <= mm.TOLERANCE


def test_a_cleared_conversation_leaves_a_notice_of_the_size_charged(client):
    converse(client, N, 1, 40, 400, False)
    while client.jobs.make_room():
        pass
    assert usage(client, *CONVERSATION_KEYS) == 0, "every conversation gave way whole"
    notices = usage(client, "cleared")
    assert int(client.r.get(client.keys.history_total)) == N * mm.CLEARED_BYTES
    print(f"a notice: {notices / N:.0f} B")
    assert abs(notices / N / mm.CLEARED_BYTES - 1) <= mm.TOLERANCE


def noise_png(seed: int) -> bytes:
    rng = random.Random(seed)
    side = rng.randint(60, 160)
    img = Image.frombytes("RGB", (side, side), bytes(rng.getrandbits(8) for _ in range(side * side * 3)))
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()


def test_a_picture_takes_its_bytes_and_what_the_model_adds(client):
    pictures = [noise_png(seed) for seed in range(N)]
    for i, data in enumerate(pictures):
        sub = client.submit(f"user{i}", None, "what is this?", image=data, group=f"addr{i % 40}")
        client.jobs.finish(sub.job, "done", answer_turn=turn_json("assistant", "a picture", job_id=sub.job))
    held = sum(mm.allocated(len(p)) for p in pictures)  # the bytes, as the allocator hands them out
    stored = sum(client.r.memory_usage(client.keys.image(hashlib.sha256(p).hexdigest()), samples=0)
                 for p in pictures)
    bookkeeping = usage(client, "images_held", "image_sizes", "image_owners", "images_of", "picture_jobs")
    overhead = (stored - held + bookkeeping) / N
    print(f"a picture of {sum(map(len, pictures)) / N:.0f} B, {held / N:.0f} B allocated: {stored / N:.0f} B "
          f"stored, {bookkeeping / N:.0f} B bookkeeping, {overhead:.0f} B beyond its allocation")
    assert abs(overhead / mm.PICTURE_BYTES - 1) <= mm.TOLERANCE


@pytest.mark.parametrize("events, token", [(30, "tok "), (100, "abcdef"), (300, "abcdef")])
def test_a_job_and_its_stream_take_what_the_model_says(client, events, token):
    answer = token * events
    payloads = 0
    for i in range(N // 4):
        sub = client.submit(f"user{i}", None, "what is this? " + "q" * 60, group=f"addr{i % 40}")
        payloads += len(client.r.hget(client.keys.job(sub.job), JobField.payload))
        writer = StreamWriter(client.r, client.keys, sub.job, client.settings.stream_maxlen)  # as the runner
        writer.add("started", worker="worker@host")
        for _ in range(events):
            writer.add("token", text=token)
        client.jobs.finish(sub.job, "done", answer_turn=turn_json("assistant", answer, job_id=sub.job), text=answer)
    n = N // 4
    job, stream = (usage(client, "job:") - payloads) / n, usage(client, "stream:") / n
    print(f"a job: {job:.0f} B beyond its payload; a stream of {events} tokens: {stream:.0f} B")
    assert abs(job / mm.JOB_BYTES - 1) <= mm.TOLERANCE
    assert abs(stream / mm.stream_bytes(events, len(answer)) - 1) <= mm.TOLERANCE


def test_a_waiting_question_takes_what_the_waiting_room_charges_it(client):
    """A crowd waiting, each visitor its own client group with one question: its job's hash, its stream (the queued
    event) and its place in line take what ``memory_model.waiting_bytes`` says; the waiting room is sized by it."""
    payloads = 0
    for i in range(N):
        sub = client.submit(f"visitor-{i:04d}-{'x' * 16}", None, "What is in the picture? " + "q" * 40,
                            group=f"198.51.{i // 250}.{i % 250}")
        payloads += len(client.r.hget(client.keys.job(sub.job), JobField.payload))
    line = usage(client, "line", "places", "idle_", "light_line", "waiting_since", "queued", "uq:", "gq:") / N
    held = (usage(client, "job:", "stream:") + line * N) / N
    print(f"a waiting question: {held:.0f} B with a {payloads / N:.0f} B payload, {line:.0f} B of it its place in line")
    assert abs(line / mm.WAITING_BYTES - 1) <= mm.TOLERANCE
    assert abs(held / mm.waiting_bytes(payloads // N) - 1) <= mm.TOLERANCE


def test_an_identity_and_an_address_take_what_their_quotas_keep(client):
    """The per-identity and per-address ledgers (text and picture quotas, the submit rate, the address's share of
    the stored pictures) of visitors who each sent one picture from an address of their own."""
    for i in range(N):
        client.submit(f"identity-{i:04d}-{'x' * 16}", None, "what is this?", image=noise_png(i),
                      group=f"203.0.113.{i}")
    identity = usage(client, "textquota:u:", "quota:u:") / N
    address = usage(client, "textquota:g:", "quota:g:", "rate:", "image_holders", "images_of:") / N
    print(f"an identity: {identity:.0f} B; an address: {address:.0f} B")
    assert abs(identity / mm.IDENTITY_BYTES - 1) <= mm.TOLERANCE
    assert abs(address / mm.ADDRESS_BYTES - 1) <= mm.TOLERANCE


def test_the_document_quotes_the_model():
    doc = (ROOT / "docs" / "redis_memory.md").read_text()
    for name in ("CONVERSATION_BYTES", "TURN_BYTES", "INDEX_ENTRY_BYTES", "CLEARED_BYTES", "PICTURE_BYTES",
                 "JOB_BYTES", "WAITING_BYTES", "STREAM_NODE_BYTES", "STREAM_EVENT_BYTES", "IDENTITY_BYTES",
                 "ADDRESS_BYTES"):
        quoted = re.search(rf"`{name}`\s*\|\s*([\d,]+)", doc)
        assert quoted, f"docs/redis_memory.md has no table row for {name}"
        assert int(quoted.group(1).replace(",", "")) == getattr(mm, name), f"{name} in the doc is stale"
    # the worked example: twelve clients, a question every 2 s each, a new 10 KB picture and two follow-ups
    example = mm.Traffic(conversations_per_day=172_800, turns_per_conversation=3, question_chars=40,
                         answer_chars=300, pictures_per_day=172_800, picture_bytes=10_000, token_events_per_answer=20)
    assert f"| {mm.conversation_bytes(example):,.0f} B a conversation" in doc
    assert f"| {mm.allocated(10_000) + mm.PICTURE_BYTES:,} B a picture" in doc
    jobs = [mm.job_bytes(example, k) for k in range(3)]
    assert f"| {jobs[0]:,.0f} to {jobs[-1]:,.0f} B a job" in doc
    held = mm.redis_bytes(example, 7 * 24 * 3600, 24 * 3600, 3600, history_budget=512 * 2**20, picture_total=2**30)
    assert f"near {held['total'] / 2**30:.1f} GiB" in doc
