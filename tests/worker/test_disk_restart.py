"""A conversation outlives its worker: real Redis, real Celery workers, the tiny LFM2-VL model, one disk-cache folder.

The first worker answers a turn and is killed (SIGKILL: nothing is flushed at exit); a worker started on the same
folder under another name claims the conversation, so affinity sends the follow-up to it, which serves it from
the disk tier and gives the tokens a recompute from history gives. A second worker on a folder in use is refused.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import pytest
import redis

from tests.redis_server import unique_prefix
from tests.worker.live import collect, png, types, wait_for
from tests.worker.worker_process import ROOT, WorkerProcess, worker_env
from training.tiny_checkpoint import ensure_tiny_checkpoint
from worker.client import OwletClient
from worker.config import Settings
from worker.store.keys import Keys

SAMPLING = {"max_new_tokens": 8, "ignore_eos": True}


@pytest.fixture
def live(redis_url, tmp_path):
    settings = Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("disk"), heartbeat_interval_s=0.5,
                                 heartbeat_ttl_s=2.0)
    client = OwletClient(settings=settings)
    env = worker_env(settings, ensure_tiny_checkpoint("lfm2vl"), OWLET_DISK_CACHE_DIR=str(tmp_path / "cache"))
    procs = []
    try:
        yield client, env, tmp_path, procs
    finally:
        for proc in procs:
            proc.stop()
        client.close(purge=True)


def test_a_follow_up_after_a_worker_restart_is_served_from_disk(live, redis_url):
    client, env, tmp_path, procs = live
    first = WorkerProcess(env, tmp_path, name="first@owlet-test")
    procs.append(first)
    first.wait_ready(client)
    sha = client.put_image(png())
    conv = client.new_conversation("ann")
    assert collect(client, client.submit_turn("ann", conv, "Describe it.", image_sha=sha,
                                              sampling=SAMPLING))[-1]["type"] == "done"
    cached = tmp_path / "cache" / (hashlib.sha256(conv.encode()).hexdigest()[:32] + ".kv")
    wait_for(cached.exists, 30, "the conversation's file on disk")
    first.kill9()
    # a restarted container comes up after its predecessor's heartbeat lapsed (2 s here): a worker claims only what no
    # live worker holds, and a second worker that started sooner on a fast host would leave it to the first
    keys = Keys(client.settings.key_prefix)
    wait_for(lambda: not client.r.exists(keys.heartbeat(first.name)), 10, "the killed worker's heartbeat to lapse")

    second = WorkerProcess(env, tmp_path, name="second@owlet-test")  # another name, as a new container has
    procs.append(second)
    second.wait_ready(client)
    r = redis.Redis.from_url(redis_url)
    assert r.get(keys.holder(conv)) == second.name.encode()  # it claimed it
    follow = collect(client, client.submit_turn("ann", conv, "And then?", sampling=SAMPLING))
    assert types(follow) == ["queued", "started", "token", "done"], follow
    assert follow[1]["worker"] == second.name
    done = follow[-1]
    assert done["stats"]["cache_source"] == "disk" and done["stats"]["cached_tokens"] > 20, done["stats"]

    # the same history and question as a new conversation, which no cache holds: recomputed from history
    history = client.history("ann", conv)[:-1]
    fresh = client.new_conversation("ann")
    job = hashlib.sha1(fresh.encode()).hexdigest()
    payload = {"job_id": job, "user": "ann", "conv": fresh, "turn": len(history) - 1, "messages": history,
               "sampling": SAMPLING}
    client.jobs.enqueue_raw(job, "ann", fresh, json.dumps(payload))
    client.dispatch()
    again = collect(client, job)[-1]
    assert again["type"] == "done" and again["stats"]["cache_source"] != "disk", again
    assert again["text"] == done["text"] and again["stats"]["generated_tokens"] == done["stats"]["generated_tokens"]


def test_a_second_worker_on_a_folder_in_use_is_refused(live):
    client, env, tmp_path, procs = live
    first = WorkerProcess(env, tmp_path, name="holder@owlet-test")
    procs.append(first)
    first.wait_ready(client)
    second = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "worker.main", "worker", "-P", "threads", "-c", "2", "-n",
         "intruder@owlet-test", "--without-gossip", "--without-mingle", "--without-heartbeat"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert second.returncode != 0
    assert "in use by another process" in second.stdout + second.stderr
