"""Riding out a Redis restart: retry a Redis call while the server is unreachable, for a bounded time.

redis-py already retries a failed command for a few seconds; a Redis restart (loading its append-only file)
can take longer. Owlet's workers and pages are not restarted with it: what must reach Redis (a finished
answer, the next stream events) is retried until Redis is back, up to ``Settings.redis_reconnect_s``.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis

log = logging.getLogger(__name__)
T = TypeVar("T")

# A server that is down, restarting or still loading its data (BusyLoadingError is a ConnectionError).
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)


def until_reachable(call: Callable[[], T], give_up_after_s: float, what: str, pause_s: float = 0.5) -> T:
    """``call()``, retried while Redis is unreachable; re-raises once ``give_up_after_s`` has passed."""
    deadline = time.monotonic() + give_up_after_s
    warned = False
    while True:
        try:
            result = call()
        except UNREACHABLE as exc:
            if time.monotonic() >= deadline:
                raise
            if not warned:
                log.warning("Redis unreachable while %s (%s); retrying for up to %.0f s", what, exc,
                            give_up_after_s)
                warned = True
            time.sleep(pause_s)
            continue
        if warned:
            log.info("Redis is back; %s done", what)
        return result
