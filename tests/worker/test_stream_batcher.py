"""The worker's shared token writer (``worker.store.stream_batcher``): many answers' writes in few round trips, each
stream in order, every token before its job's terminal event, and nothing stuck when Redis is away."""
from __future__ import annotations

import threading

import redis

from tests.redis_server import free_port
from worker.store.keys import JobState
from worker.store.stream_batcher import StreamBatcher
from worker.store.streams import StreamWriter, decode, encode


def test_many_answers_writes_share_round_trips_and_each_stream_keeps_its_order(client):
    batcher = StreamBatcher(client.r)
    answers, chunks = 16, 20
    writers = [StreamWriter(client.r, client.keys, f"job{i}", 1000, batcher) for i in range(answers)]
    try:
        def answer(writer: StreamWriter) -> None:
            for k in range(chunks):
                writer.add("token", text=f"{k} ")
            writer.flush()

        threads = [threading.Thread(target=answer, args=(w,)) for w in writers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        for i in range(answers):  # flushed: every write is in its stream, in the order it was handed in
            texts = [decode(fields)["text"] for _, fields in client.r.xrange(client.keys.stream(f"job{i}"))]
            assert texts == [f"{k} " for k in range(chunks)]
        batched = answers * (chunks - 1)  # each answer's first write went out on its own, at once
        assert 0 < batcher.round_trips < batched / 2, f"{batched} writes took {batcher.round_trips} round trips"
    finally:
        batcher.close()


def test_every_token_is_in_the_stream_before_the_terminal_event(client, fake_capacity):
    fake_capacity(2)
    job = client.submit_turn("ann", client.new_conversation("ann"), "hi")
    n = int(client.r.hget(client.keys.job(job), "dispatch_n"))
    assert client.jobs.claim(job, n, "w@x")
    batcher = StreamBatcher(client.r, window_s=0.05)  # a long window: the writes are still waiting at the end
    try:
        writer = StreamWriter(client.r, client.keys, job, 1000, batcher)
        for k in range(10):
            writer.add("token", text=f"{k} ")
        # what the runner does before its result goes to FINISH: the writes still waiting go with the last tokens
        tail = writer.take_unsent() + "end"
        assert client.jobs.finish_and_take(job, JobState.done, only_worker="w@x", tail=tail, text="0 1 end")[0]
        events = [decode(fields) for _, fields in client.r.xrange(client.keys.stream(job))]
        tokens = [e for e in events if e["type"] == "token"]
        assert events[-1]["type"] == "done" and events[-1 - len(tokens):-1] == tokens, "every token before done"
        assert "".join(e["text"] for e in tokens) == "".join(f"{k} " for k in range(10)) + "end"
        assert len(tokens) < 11, "the waiting writes went with the finish, not in round trips of their own"
        assert not client.jobs.finish_and_take(job, JobState.done, tail="again")[0], "it had ended"
        assert client.r.xlen(client.keys.stream(job)) == len(events), "a finish that ends nothing writes nothing"
    finally:
        batcher.close()


def test_an_answer_that_ends_takes_its_waiting_writes_back_for_its_finish_and_no_text_is_lost(client):
    """At an answer's end its writes still waiting for the batcher's round trip go with its finish instead (the
    runner hands their text to the finish, before its last tokens), so its end costs no round trip of its own;
    writes already on their way land first. Many answers ending at once, each stream read back in full: every text
    once, in order, and the batcher sent fewer round trips than answers."""
    batcher = StreamBatcher(client.r, window_s=0.02)
    answers, chunks = 24, 12
    writers = [StreamWriter(client.r, client.keys, f"job{i}", 1000, batcher) for i in range(answers)]
    carried = {}
    try:
        def answer(i: int, writer: StreamWriter) -> None:
            for k in range(chunks):
                writer.add("token", text=f"{i}.{k} ")
            carried[i] = writer.take_unsent()
            # what FINISH does with it: one token event, then the terminal one
            client.r.xadd(writer.key, encode("token", text=carried[i] + "end"))

        threads = [threading.Thread(target=answer, args=(i, w)) for i, w in enumerate(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        for i in range(answers):
            texts = [decode(fields)["text"] for _, fields in client.r.xrange(client.keys.stream(f"job{i}"))]
            assert "".join(texts) == "".join(f"{i}.{k} " for k in range(chunks)) + "end", "every text once, in order"
        assert any(carried.values()), "some answers ended with writes still waiting, and took them back"
        assert batcher.round_trips < answers, f"{answers} answers ended, {batcher.round_trips} round trips"
        # a write handed in after one was taken back is still sent, and waited for by its number
        late = batcher.add(client.keys.stream("late"), encode("token", text="late"), 100)
        assert batcher.wait_sent(late, 5) and client.r.xlen(client.keys.stream("late")) == 1
    finally:
        batcher.close()


def test_writes_taken_back_are_returned_even_when_one_on_its_way_is_slow(client):
    """A write on its way that takes longer than the wait: the writes taken back are nowhere else, so they still come
    back to the runner (for its finish), and the slow one lands when its round trip ends."""
    batcher = StreamBatcher(client.r, window_s=0)
    release, sending = threading.Event(), threading.Event()
    send = batcher._send

    def slow_send(batch):
        sending.set()
        release.wait(10)
        send(batch)

    batcher._send = slow_send
    try:
        key = client.keys.stream("slow")
        batcher.add(key, encode("token", text="a "), 100)
        assert sending.wait(5), "the first write is on its way"
        last = batcher.add(key, encode("token", text="b "), 100)
        taken = batcher.take_back(key, last, 0.2)
        assert [decode({k.encode(): v.encode() for k, v in f.items()})["text"] for f in taken] == ["b "]
        release.set()
        assert batcher.wait_sent(last, 5) and [decode(f)["text"] for _, f in client.r.xrange(key)] == ["a "]
    finally:
        release.set()
        batcher.close()


def test_writes_that_are_not_tokens_are_not_taken_back(client):
    batcher = StreamBatcher(client.r, window_s=0.5)  # a long window: the writes wait
    try:
        key = client.keys.stream("j")
        batcher.add(key, encode("token", text="a"), 100)
        last = batcher.add(key, encode("notice", text="b"), 100)
        assert batcher.take_back(key, last, 5) is None, "only token events go with a finish"
        assert batcher.wait_sent(last, 5) and [decode(f)["text"] for _, f in client.r.xrange(key)] == ["a", "b"]
    finally:
        batcher.close()


def test_writes_to_an_unreachable_redis_are_dropped_and_nobody_waits_for_them(caplog):
    away = redis.Redis(port=free_port(), socket_connect_timeout=0.5, socket_timeout=0.5)
    batcher = StreamBatcher(away)
    try:
        last = 0
        for k in range(5):
            last = batcher.add("gone:stream:j", encode("token", text=str(k)), 100)
        assert batcher.wait_sent(last, 5), "a runner would wait on writes Redis never took"
        assert "dropped" in caplog.text and batcher.round_trips == 0
        later = batcher.add("gone:stream:j", encode("token", text="later"), 100)  # within the retry pause: dropped
        assert batcher.wait_sent(later, 0.1)
    finally:
        batcher.close()
