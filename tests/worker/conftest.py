"""Fixtures for worker tests: a real Redis (found or started), a unique key prefix per test, a client."""
from __future__ import annotations

import pytest
import redis

from tests.redis_server import redis_url_fixture, unique_prefix
from worker.client import OwletClient
from worker.config import Settings
from worker.heartbeat import Heartbeat, publish
from worker.store.keys import Keys

redis_url = redis_url_fixture()


@pytest.fixture
def settings(redis_url) -> Settings:
    return Settings.from_env(redis_url=redis_url, key_prefix=unique_prefix("wt"), user_queue_cap=60,
                             global_queue_cap=100, group_job_cap=100, group_submit_limit=1000)


@pytest.fixture
def r(redis_url):
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


@pytest.fixture
def client(settings, r):
    c = OwletClient(settings=settings)
    yield c
    c.close()
    keys = list(r.scan_iter(match=settings.key_prefix + "*", count=1000))
    if keys:
        r.delete(*keys)


@pytest.fixture
def fake_capacity(r, settings):
    """Publish a heartbeat for a worker that never consumes, so the dispatcher sees free slots.

    This exercises the dispatcher's real Redis and Celery paths; the jobs just stay in Celery's queue.
    """

    def publish_capacity(capacity: int, name: str = "idle@test", **fields) -> Heartbeat:
        beat = Heartbeat(worker=name, capacity=capacity, **fields)
        publish(r, Keys(settings.key_prefix), beat, ttl_s=60)
        return beat

    return publish_capacity
