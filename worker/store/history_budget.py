"""The service-wide budgets that come from the Redis Owlet runs on: conversation history, in bytes as
``worker.store.memory_model`` charges them, and the waiting room (how many questions may wait in line at once).

Conversations past it give way whole, least recently used first (SUBMIT, ``worker/queue/lua/submit.lua``). Its
default comes from the Redis it runs on, so that conversation text alone can never fill it: half of what
``maxmemory`` leaves beside the pictures' service total (``image_quota_total_bytes``), and at least an eighth of
``maxmemory``. The other half is for what the budget does not cover, whose size the traffic sets and the TTLs bound:
jobs and their streams, quotas, the queue (docs/redis_memory.md has the formula). With ``maxmemory 2gb`` and the
default 1 GiB of pictures, conversations get 512 MiB. A Redis without a maxmemory (or one that does not let its
configuration be read) gets ``UNLIMITED_REDIS_BUDGET``; ``history_total_bytes`` sets it outright.

Should Redis reach its maxmemory anyway, SUBMIT is refused whole, and ``JobStates.enqueue_raw`` makes room
(MAKE_ROOM) and asks again: ``room_bytes`` says how much a round gives back.
"""
from __future__ import annotations

import redis

from worker.store import memory_model
from worker.config import Settings

UNLIMITED_REDIS_BUDGET = 512 * 1024 * 1024
MIN_ROOM_BYTES = 16 * 1024
# The waiting room's share of Redis's maxmemory (half of the history budget's usual share), and its size in a Redis
# without one. Beside it the workers hold only what they answer now.
WAITING_ROOM_SHARE = 8
MIN_WAITING_ROOM = 1000


def redis_maxmemory(r: redis.Redis) -> int:
    """Redis's ``maxmemory`` in bytes; 0 when it has none, or does not let its configuration be read."""
    try:
        return int(r.config_get("maxmemory").get("maxmemory") or 0)
    except (redis.RedisError, ValueError):
        return 0


def history_budget(settings: Settings, maxmemory: int) -> int:
    """The history budget for a Redis whose ``maxmemory`` is given (0 = none)."""
    if settings.history_total_bytes > 0:
        return settings.history_total_bytes
    if maxmemory <= 0:
        return UNLIMITED_REDIS_BUDGET
    return max(maxmemory // 8, (maxmemory - settings.image_quota_total_bytes) // 2)


def room_bytes(budget: int) -> int:
    """What one round of MAKE_ROOM gives back at least: a thirty-second of the budget."""
    return max(MIN_ROOM_BYTES, budget // 32)


def waiting_room(settings: Settings, maxmemory: int) -> int:
    """How many questions may wait in line at once, service-wide: ``global_queue_cap`` when set, else as many as an
    eighth of Redis's ``maxmemory`` holds (``memory_model.waiting_bytes`` each: about 7 KB, so 2 GB of Redis lets
    about 36,000 wait), at least ``MIN_WAITING_ROOM``; a Redis without a maxmemory gets as many as a quarter of
    ``UNLIMITED_REDIS_BUDGET`` holds. Identities and groups have their own caps beside it."""
    if settings.global_queue_cap > 0:
        return settings.global_queue_cap
    room = maxmemory // WAITING_ROOM_SHARE if maxmemory > 0 else UNLIMITED_REDIS_BUDGET // 4
    return max(MIN_WAITING_ROOM, room // memory_model.waiting_bytes())
