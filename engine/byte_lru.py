"""A thread-safe LRU map bounded by bytes, not entries. Used for image features (and by the session store)."""
from __future__ import annotations

import threading
from collections import OrderedDict


class ByteLRU:
    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        self._items: OrderedDict = OrderedDict()  # key -> (value, nbytes)
        self._lock = threading.Lock()
        self.bytes_held = 0
        self.hits = self.misses = self.evictions = 0

    def get(self, key):
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return item[0]

    def put(self, key, value, nbytes: int) -> list:
        """Insert and evict least-recently-used entries until within budget; returns evicted (key, value)s.

        An item larger than the whole budget is not stored at all.
        """
        evicted = []
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self.bytes_held -= old[1]
            if nbytes > self.budget:
                return evicted
            self._items[key] = (value, nbytes)
            self.bytes_held += nbytes
            while self.bytes_held > self.budget:
                k, (v, n) = self._items.popitem(last=False)
                self.bytes_held -= n
                self.evictions += 1
                evicted.append((k, v))
        return evicted

    def pop(self, key):
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self.bytes_held -= item[1]
            return item[0]

    def __contains__(self, key) -> bool:
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def keys(self) -> list:
        with self._lock:
            return list(self._items)
