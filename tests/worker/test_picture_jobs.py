"""A stored picture's live jobs (``Keys.picture_jobs``): what keeps it from giving way to new pictures.

A picture a crowd asks about (an example's, or one shared around) is asked about by thousands within a job's lifetime.
The set must hold its live jobs only (FINISH takes each out), and the check that reads it (``needed`` in budgets.lua,
run for each picture SUBMIT considers giving way) must read a few members, not every job that ever asked.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json

import pytest
from PIL import Image

from tests.redis_server import small_redis
from tests.worker.test_line_scale import commands
from worker.client import OwletClient
from worker.queue.scripts import compose
from worker.store.keys import JobField

_NEEDED = compose("""#!lua
return needed(KEY.image .. args.sha) and 1 or 0
""", "needed")


@pytest.fixture
def own_settings(settings, tmp_path):
    """The suite's settings on a Redis of this test's own: the commands counted are this test's alone."""
    with small_redis(tmp_path) as url:
        yield dataclasses.replace(settings, redis_url=url)


def png(seed: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (32, 32), (seed % 256, 40, 90)).save(out, format="PNG")
    return out.getvalue()


def needed(client, sha: str) -> tuple[int, int]:
    """(whether the picture counts as needed, the Redis commands that took, the EVAL itself included)."""
    client.r.config_resetstat()
    answer = client.r.eval(_NEEDED, 0, json.dumps({"prefix": client.keys.prefix, "sha": sha}))
    return answer, commands(client.r) - 1  # the CONFIG RESETSTAT


def test_a_picture_holds_its_live_jobs_only_and_each_one_ending_takes_it_out(own_settings):
    client = OwletClient(settings=own_settings)
    picture = png(1)
    sha = hashlib.sha256(picture).hexdigest()
    jobs_of = client.keys.picture_jobs(client.keys.image(sha))
    try:
        first = client.submit("owner", None, "what is this?", image=picture, group="addr:owner").job
        asked = [client.submit(f"v{i}", None, "and this?", image_sha=sha, group=f"addr:{i}").job for i in range(20)]
        assert client.r.hget(client.keys.job(first), JobField.picture).decode() == sha
        assert client.r.scard(jobs_of) == 21
        assert needed(client, sha)[0] == 1
        popped = client.jobs.pop(100)[0]
        assert client.jobs.requeue(popped, "worker lost") == 1
        assert client.r.sismember(jobs_of, popped), "a job put back in line still needs its picture"
        for job in asked[:10]:
            assert client.jobs.finish(job, "done")
        assert client.jobs.cancel(asked[10])
        assert client.r.scard(jobs_of) == 10
        for job in [first, *asked[11:]]:
            assert client.jobs.cancel(job)
        assert not client.r.exists(jobs_of), "every job that asked about it ended: nothing holds it"
        assert needed(client, sha)[0] == 0
    finally:
        client.close(purge=True)


def test_the_check_reads_a_few_jobs_however_many_ended_without_leaving(own_settings):
    """Jobs an earlier version left in the set as they ended (or whose hashes expired unfinished): the check reads a
    bounded few a call, drops those, counts the picture as needed while more may remain, and lets it go once none
    are left."""
    client = OwletClient(settings=own_settings)
    sha = "ab" * 32
    jobs_of = client.keys.picture_jobs(client.keys.image(sha))
    try:
        client.r.sadd(jobs_of, *[f"ended-{i}" for i in range(1000)])  # no hash: ended and expired
        answer, spent = needed(client, sha)
        assert answer == 1 and spent <= 40, f"{spent} commands for one check"
        assert client.r.scard(jobs_of) == 1000 - 16
        answered_needed = 1
        while needed(client, sha)[0]:
            answered_needed += 1
        # sixteen dropped a call: 62 calls found a full sixteen (maybe more left), the 63rd the last eight
        assert not client.r.exists(jobs_of) and answered_needed == 1000 // 16
        live = client.submit("asker", None, "hi", group="addr:asker").job
        client.r.sadd(jobs_of, *[f"ended-{i}" for i in range(1000)], live)
        for _ in range(100):  # (it may answer as soon as it meets the live job, or after sixteen that ended)
            answer, spent = needed(client, sha)
            assert answer == 1 and spent <= 40, "a picture with a live job never gives way"
        assert client.r.sismember(jobs_of, live)
    finally:
        client.close(purge=True)
