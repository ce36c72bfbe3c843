"""What a Redis is: does it answer at this URL (the demo launcher and the tests decide by it whether to start one),
and does it evict keys when full (a worker refuses such a Redis at start)."""
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


def evicting_policy(r: redis.Redis) -> tuple[str, int] | None:
    """``(maxmemory-policy, maxmemory)`` when this Redis evicts keys once full: a ``maxmemory`` and any policy but
    ``noeviction``. A job's hash and stream and a conversation carry expiries, so even a ``volatile-*`` policy would
    take questions in line, answers and conversations away without a word (``allkeys-*`` the line itself too); with
    ``noeviction`` a full Redis refuses a new turn whole and the visitor is told. None when it does not evict, or
    does not let its configuration be read (a managed Redis may not: nothing can be told then)."""
    try:
        config = r.config_get("maxmemory*")
        maxmemory, policy = int(config.get("maxmemory") or 0), config.get("maxmemory-policy") or "noeviction"
    except (redis.ResponseError, ValueError):
        return None
    return (policy, maxmemory) if maxmemory > 0 and policy != "noeviction" else None
