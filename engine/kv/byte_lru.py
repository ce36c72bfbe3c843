"""A thread-safe LRU map bounded by bytes, not entries. Used for image features and by the session store.

An entry may hold bytes in several pools, each with its own budget: the session store keeps "device" bytes
(on the accelerator) and "host" bytes (parked in host memory) apart. With a plain ``int`` budget there is one
pool and ``nbytes`` is a plain ``int`` too.
"""
from __future__ import annotations

import threading
from collections import OrderedDict

ONE_POOL = "bytes"


class ByteLRU:
    def __init__(self, budget_bytes: int | dict[str, int]):
        budgets = budget_bytes if isinstance(budget_bytes, dict) else {ONE_POOL: budget_bytes}
        self.budgets = {pool: int(n) for pool, n in budgets.items()}
        self.held = dict.fromkeys(self.budgets, 0)  # pool -> bytes held
        self._items: OrderedDict = OrderedDict()  # key -> (value, {pool: nbytes})
        self._lock = threading.Lock()
        self.hits = self.misses = self.evictions = 0

    @property
    def budget(self) -> int:
        return sum(self.budgets.values())

    @property
    def bytes_held(self) -> int:
        return sum(self.held.values())

    def get(self, key):
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key, value, nbytes: int | dict[str, int]) -> list:
        """Insert and evict least-recently-used entries until every pool is within budget; returns evicted
        (key, value)s. An item larger than a pool's whole budget is not stored at all.
        """
        sizes = nbytes if isinstance(nbytes, dict) else {ONE_POOL: nbytes}
        assert set(sizes) <= set(self.budgets), f"unknown byte pools {set(sizes) - set(self.budgets)}"
        evicted = []
        with self._lock:
            self._remove(key)
            if any(n > self.budgets[pool] for pool, n in sizes.items() if n):
                return evicted
            self._items[key] = (value, sizes)
            self._add(sizes, +1)
            while over := {pool for pool, n in self.held.items() if n > self.budgets[pool]}:
                victim = next(k for k, (_, s) in self._items.items() if any(s.get(pool) for pool in over))
                evicted.append((victim, self._remove(victim)))
                self.evictions += 1
        return evicted

    def pop(self, key):
        with self._lock:
            return self._remove(key)

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def keys(self) -> list:
        with self._lock:
            return list(self._items)

    def items(self) -> list:
        """(key, value, {pool: nbytes}) for every entry, least recently used first; recency is left as it was."""
        with self._lock:
            return [(key, value, dict(sizes)) for key, (value, sizes) in self._items.items()]

    def _remove(self, key):
        item = self._items.pop(key, None)
        if item is None:
            return None
        self._add(item[1], -1)
        return item[0]

    def _add(self, sizes: dict[str, int], sign: int) -> None:
        for pool, n in sizes.items():
            self.held[pool] += sign * n
