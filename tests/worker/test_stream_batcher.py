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
        writer.flush()  # what the runner does before its result goes to FINISH, with the answer's last tokens
        assert client.jobs.finish_and_take(job, JobState.done, only_worker="w@x", tail="end", text="0 1 end")[0]
        events = [decode(fields) for _, fields in client.r.xrange(client.keys.stream(job))]
        assert [e["type"] for e in events][-12:] == ["token"] * 11 + ["done"]
        assert [e["text"] for e in events[-12:-1]] == [f"{k} " for k in range(10)] + ["end"]
        assert not client.jobs.finish_and_take(job, JobState.done, tail="again")[0], "it had ended"
        assert client.r.xlen(client.keys.stream(job)) == len(events), "a finish that ends nothing writes nothing"
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
