"""kill -9 of a real worker mid-generation: the job is re-dispatched once and the conversation keeps its turns."""
from __future__ import annotations

from tests.redis_server import unique_prefix
from tests.worker.live import collect, types, wait_for
from tests.worker.test_worker_jobs import LONG
from tests.worker.worker_process import WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings


def test_kill_9_mid_generation_redispatches_to_another_worker(redis_url, tmp_path):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("kill"), heartbeat_interval_s=0.3,
                                 heartbeat_ttl_s=1.5)
    client = OwletClient(settings=settings)
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"))
    first = WorkerProcess(env, tmp_path, name="first@owlet-test")
    second = None
    try:
        first.wait_ready(client)
        conv = client.new_conversation("ann")
        done = collect(client, client.submit_turn("ann", conv, "Hello.", sampling={"max_new_tokens": 4}))
        assert done[-1]["type"] == "done"

        # long enough that the kill lands mid-generation, short enough to finish quickly on the retry
        job = client.submit_turn("ann", conv, "Talk for a long time.", sampling={**LONG, "max_new_tokens": 100})
        stream = client.events(job)
        seen = []
        for _, event in stream:
            seen.append(event)
            if event["type"] == "token":
                break
        assert seen[-2]["worker"] == first.name  # affinity sent the follow-up to the first worker
        first.kill9()

        second = WorkerProcess(env, tmp_path, name="second@owlet-test")
        rest = [e for _, e in stream]  # the reader's own sweeps notice the dead worker while it waits
        events = seen + rest
        assert types(events) == ["queued", "started", "token", "queued", "started", "token", "done"], types(events)
        restart = events.index(next(e for e in events[2:] if e["type"] == "queued"))
        assert events[restart]["restart"] is True
        assert events[restart + 1]["worker"] == second.name
        answer = events[-1]["text"]
        assert answer == "".join(e["text"] for e in events[restart:] if e["type"] == "token")
        assert [t["role"] for t in client.history("ann", conv)] == ["user", "assistant", "user", "assistant"]
        assert client.history("ann", conv)[-1]["text"] == answer
        wait_for(lambda: first.name.encode() not in client.r.smembers(settings.key_prefix + "workers"), 10,
                 "dead worker forgotten")
        assert client.health()["redispatched"] == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()
        keys = list(client.r.scan_iter(match=settings.key_prefix + "*", count=1000))
        if keys:
            client.r.delete(*keys)
        client.close()
