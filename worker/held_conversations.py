"""A worker that starts with conversations on disk names itself their holder, so affinity sends their follow-ups
back to it.

Affinity (``worker.queue.dispatch``) routes a follow-up to the worker ``Keys.holder(conv)`` names; FINISH writes
that key after each turn, for ``holder_ttl_s``. A worker restarted on the same disk-cache folder
(``OWLET_DISK_CACHE_DIR``, ``engine.kv.disk_tier``) holds those conversations' caches again, but the keys may name it
under an old name (a new container's host name) or have expired. At start it therefore claims each conversation it
holds on disk that still exists, unless a live worker other than itself holds it: that one served a later turn,
and its cache is the newer. Claiming is a routing hint only: a claim that races a turn finishing elsewhere costs
that conversation's next turn a recompute, never a wrong answer.
"""
from __future__ import annotations

from collections.abc import Iterable

import redis

from worker import heartbeat
from worker.store.keys import Keys

_CHUNK = 500  # conversations read per round trip


def claim(r: redis.Redis, keys: Keys, worker: str, convs: Iterable[str], ttl_s: int) -> int:
    """Name ``worker`` the holder of each of ``convs`` no other live worker holds; returns how many it claimed."""
    convs = list(convs)
    alive = set(heartbeat.alive(r, keys)) - {worker}
    claimed = 0
    for start in range(0, len(convs), _CHUNK):
        chunk = convs[start:start + _CHUNK]
        with r.pipeline(transaction=False) as p:
            for conv in chunk:
                p.get(keys.holder(conv))
                p.exists(keys.conversation(conv))
            replies = p.execute()
        with r.pipeline(transaction=False) as p:
            for conv, holder, exists in zip(chunk, replies[0::2], replies[1::2]):
                if exists and (holder is None or holder.decode() not in alive):
                    p.set(keys.holder(conv), worker, ex=ttl_s)
                    claimed += 1
            p.execute()
    return claimed
