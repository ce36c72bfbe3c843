"""Two real workers: affinity picks the one holding the conversation; kill -9 of it mid-generation makes the
job re-dispatch once to the other, and the conversation keeps every completed turn."""
from __future__ import annotations

import signal

from tests.redis_server import unique_prefix
from tests.worker.live import collect, types, wait_for
from tests.worker.test_worker_jobs import LONG
from tests.worker.worker_process import WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings


def test_affinity_then_kill_9_mid_generation_redispatches_to_the_other_worker(redis_url, tmp_path):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("kill"), heartbeat_interval_s=0.3,
                                 heartbeat_ttl_s=1.5)
    client = OwletClient(settings=settings)
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"))
    workers = {w.name: w for w in (WorkerProcess(env, tmp_path, name="one@owlet-test"),
                                   WorkerProcess(env, tmp_path, name="two@owlet-test"))}
    try:
        for w in workers.values():
            w.wait_ready(client)
        conv = client.new_conversation("ann")
        first = collect(client, client.submit_turn("ann", conv, "Hello.", sampling={"max_new_tokens": 4}))
        assert types(first) == ["queued", "started", "token", "done"]
        holder = first[1]["worker"]
        survivor = next(name for name in workers if name != holder)

        # long enough that the kill lands mid-generation, short enough to finish quickly on the retry
        job = client.submit_turn("ann", conv, "Talk for a long time.", sampling={**LONG, "max_new_tokens": 100})
        stream = client.events(job)
        seen = []
        for _, event in stream:
            seen.append(event)
            if event["type"] == "token":
                # held still at once, so the kill lands mid-generation however fast this machine decodes
                workers[holder].proc.send_signal(signal.SIGSTOP)
                break
        assert seen[-2]["worker"] == holder  # affinity: the follow-up went to the worker holding the cache
        assert client.health()["affinity_hits"] == 1
        workers[holder].kill9()

        rest = [e for _, e in stream]  # the survivor's sweeps (and the reader's) notice the dead worker
        events = seen + rest
        assert types(events) == ["queued", "started", "token", "queued", "started", "token", "done"], types(events)
        restart = events.index(next(e for e in events[2:] if e["type"] == "queued"))
        assert events[restart]["restart"] is True
        assert events[restart + 1]["worker"] == survivor
        answer = events[-1]["text"]
        assert answer == "".join(e["text"] for e in events[restart:] if e["type"] == "token")
        history = client.history("ann", conv)
        assert [t["role"] for t in history] == ["user", "assistant", "user", "assistant"]
        assert history[1]["text"] == first[-1]["text"] and history[-1]["text"] == answer
        wait_for(lambda: holder.encode() not in client.r.smembers(settings.key_prefix + "workers"), 10,
                 "dead worker forgotten")
        health = client.health()
        assert health["redispatched"] == 1 and [w["worker"] for w in health["workers"]] == [survivor]
    finally:
        for w in workers.values():
            w.stop()
        client.close(purge=True)
