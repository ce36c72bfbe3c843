"""Does a Redis answer at this URL? Used by the demo launcher and the tests to decide whether to start one."""
from __future__ import annotations

import redis


def redis_answers(url: str, timeout_s: float = 0.5) -> bool:
    """True when a PING to ``url`` succeeds within ``timeout_s``."""
    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except (redis.RedisError, OSError, ValueError):
        return False
