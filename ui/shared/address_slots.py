"""Per-address limits inside one UI process: concurrent page events and concurrent image decodes.

Every answer stream holds one of Gradio's worker threads (``max_threads``) until it ends, and every image decode holds a
thread of the decode pool. Without a per-address limit one client could hold all of them and leave honest visitors
waiting in Gradio's own queue, before Owlet's fair queue ever sees them. A refused slot is a message, never a wait in a
thread; a few callers wait a moment for one on the event loop first (an image check, a reloaded page following its
answer). The queue-wide limits (queued plus running jobs, submissions per minute, image bytes) live in Redis, where
every UI replica sees them (``worker/queue/lua/submit.lua``).
"""
from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter


class SlotRefused(Exception):
    """No free slot for this address; ``user_message`` says what to do. Reported as ``worker.errors.OwletError``
    subclasses are: its metric label, HTTP status and API code."""

    metric_kind, http_status, api_code = "client_busy", 429, "address_busy"

    def __init__(self, user_message: str):
        super().__init__(user_message)
        self.user_message = user_message


class AddressSlots:
    """At most ``limit`` holders at once per address (thread-safe; handlers run on threads and the loop)."""

    def __init__(self, limit: int, refusal: str, max_waiting: int | None = None):
        assert limit >= 1, "a per-address limit must be at least 1"
        self.limit, self.refusal = limit, refusal
        self.max_waiting = max_waiting  # callers of one address in acquire_within at once (None: no cap)
        self._held: Counter[str] = Counter()
        self._waiting: Counter[str] = Counter()  # callers in acquire_within, per address
        self._lock = threading.Lock()

    def acquire(self, address: str) -> None:
        """Take one of ``address``'s slots, or raise SlotRefused; pair with ``release``."""
        with self._lock:
            if self._held[address] >= self.limit:
                raise SlotRefused(self.refusal)
            self._held[address] += 1

    async def acquire_within(self, address: str, wait_s: float, poll_s: float = 0.05) -> None:
        """``acquire``, waiting up to ``wait_s`` for a slot to come free (holding nothing meanwhile). With
        ``max_waiting``, one more waiter of an address is refused at once."""
        try:
            return self.acquire(address)
        except SlotRefused:
            with self._lock:
                if wait_s <= 0 or (self.max_waiting is not None and self._waiting[address] >= self.max_waiting):
                    raise
                self._waiting[address] += 1
        try:
            deadline = time.monotonic() + wait_s
            while True:
                await asyncio.sleep(poll_s)
                try:
                    return self.acquire(address)
                except SlotRefused:
                    if time.monotonic() >= deadline:
                        raise
        finally:
            with self._lock:
                self._waiting[address] -= 1
                if self._waiting[address] <= 0:
                    del self._waiting[address]

    def release(self, address: str) -> None:
        with self._lock:
            self._held[address] -= 1
            if self._held[address] <= 0:
                del self._held[address]

    def held(self, address: str) -> int:
        with self._lock:
            return self._held[address]
