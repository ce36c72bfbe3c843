"""One queue serves one checkpoint (``worker.heartbeat.other_models``, which a worker reads before it joins): a live
worker of another checkpoint is found at once; a heartbeat a killed worker left is waited out, not counted."""
from __future__ import annotations

import threading
import time

from worker import heartbeat
from worker.store.keys import Keys
from tests.redis_server import unique_prefix

TTL_S = 1.0


def beat(r, keys, worker, model):
    heartbeat.publish(r, keys, heartbeat.Heartbeat(worker=worker, capacity=4, model=model), ttl_s=TTL_S)


def test_a_live_worker_of_another_checkpoint_is_found_at_once(r):
    keys, stop = Keys(unique_prefix("one-ckpt")), threading.Event()

    def serving():
        while not stop.is_set():
            beat(r, keys, "a@host", "qwen2-vl-2b")
            stop.wait(0.2)
    beat(r, keys, "a@host", "qwen2-vl-2b")
    beat(r, keys, "b@host", "owlet-shapes-vl")  # one of the same checkpoint is no obstacle
    thread = threading.Thread(target=serving, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        assert heartbeat.other_models(r, keys, "me@host", "owlet-shapes-vl", TTL_S) == ["qwen2-vl-2b"]
        assert time.monotonic() - started < TTL_S, "a refreshed heartbeat is a worker serving now: no wait"
        assert heartbeat.other_models(r, keys, "me@host", "qwen2-vl-2b", TTL_S) == []
        assert heartbeat.other_models(r, keys, "me@host", "", TTL_S) == [], "an engine without a checkpoint"
    finally:
        stop.set()
        thread.join()


def test_a_heartbeat_left_by_a_killed_worker_is_waited_out(r):
    keys = Keys(unique_prefix("one-ckpt"))
    beat(r, keys, "killed@host", "qwen2-vl-2b")  # never refreshed: its worker is gone
    started = time.monotonic()
    assert heartbeat.other_models(r, keys, "me@host", "owlet-shapes-vl", TTL_S, poll_s=0.1) == []
    assert time.monotonic() - started <= TTL_S + 0.5
    # the same worker's own earlier heartbeat (a restart under the same name) is not another's
    beat(r, keys, "me@host", "qwen2-vl-2b")
    assert heartbeat.other_models(r, keys, "me@host", "owlet-shapes-vl", TTL_S) == []
