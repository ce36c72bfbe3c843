"""Prefix routing: a conversation's first question goes, when it can, to a worker that already computed its prompt.

The engine keeps a new conversation's prompt prefixes for other conversations (engine/kv/prefix_index.py): the same
picture and question, or the same picture. The dispatcher cannot see token ids, so both sides name such a prefix
by what the submitting side knows, ``route_keys``: a hash of the messages (roles, texts, stored image hashes) of a
first question, and a hash of the same without the question's text when it carries a picture. A worker remembers
the keys of the first questions it ran (``HeldRoutes``, the most recent few) and announces them in its heartbeat;
``FairDispatch.send`` sends a first question whose conversation nobody holds to the least loaded live worker
announcing one of its keys, if that worker has a free slot, as it does a follow-up to its conversation's holder.

It is a hint: the engine may have evicted the prefix (it then prefills, as anywhere else). It never changes which
job is dispatched next or how many run (POP decides both), only which worker's queue the job goes to.
"""
from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict

from worker.store.jobs import HISTORY_IN_CONVERSATION

HELD_ROUTES = 64  # keys a worker announces: its most recent first questions' (about 1 KB of heartbeat)


def route_keys(messages) -> list[str]:
    """Keys of the prefixes an engine keeps for this turn, longest first: none unless it is a conversation's first
    question (no answer before it). ``messages``: ``worker.store.jobs.Message``s or (role, text, image_sha) tuples."""
    turns = [m if isinstance(m, tuple) else (m.role, m.text, m.image_sha) for m in messages]
    if not turns or turns[-1][0] != "user" or any(role == "assistant" for role, _, _ in turns):
        return []
    keys = [_digest(turns)]
    role, _, image = turns[-1]
    if image:
        keys.append(_digest(turns[:-1] + [(role, None, image)]))
    return keys


def job_route_keys(payload: bytes | str | None) -> list[str]:
    """``route_keys`` of a job's payload (``Keys.job``'s ``payload`` field); [] when it cannot be read, and for a
    follow-up (whose payload carries its question alone: ``worker.store.jobs``)."""
    try:
        data = json.loads(payload)
        if data.get(HISTORY_IN_CONVERSATION) is True:
            return []
        return route_keys([(m["role"], m["text"], m.get("image_sha")) for m in data["messages"]])
    except (TypeError, ValueError, KeyError, AttributeError):
        return []


def pick_worker(keys: list[str], workers: dict, assigned: dict[str, int]) -> str | None:
    """The least loaded live worker announcing the longest of ``keys`` that has a free slot; None otherwise."""
    for key in keys:
        free = [(beat.load + assigned.get(name, 0), name) for name, beat in workers.items()
                if key in beat.prefixes and beat.load + assigned.get(name, 0) < beat.capacity]
        if free:
            return min(free)[1]
    return None


class HeldRoutes:
    """The route keys of the first questions this worker ran, the most recent ``limit`` (thread-safe)."""

    def __init__(self, limit: int = HELD_ROUTES):
        self.limit = limit
        self._keys: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, keys) -> None:
        with self._lock:
            for key in keys:
                self._keys[key] = None
                self._keys.move_to_end(key)
            while len(self._keys) > self.limit:
                self._keys.popitem(last=False)

    def recent(self) -> list[str]:
        with self._lock:
            return list(self._keys)


def _digest(turns) -> str:
    return hashlib.sha256(json.dumps(turns, ensure_ascii=False).encode()).hexdigest()[:16]
