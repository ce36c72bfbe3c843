"""How many large API bodies the page reads at once: a few per client address, and a byte total for the page.

A chat completion carries its pictures in its body as base64, so one may be up to ``api_max_request_bytes``
(``ui.edge.body_limits``), and the page holds it whole in memory while it is read and parsed (an upload goes to disk
as it arrives instead). Without a bound, clients holding many such requests open would hold that many bodies of
memory. A body over the page's ordinary cap (``max_request_bytes``: a text-only request is far below it) takes one of
its address's slots (as many as the uploads an address may have arriving at once) and its declared length from the
page's total (``api_bodies_max_bytes``) until it is parsed; past either, the request is refused with 429 or 503 and a
time to come back, before its body is read.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from ui.api.errors import ApiError
from ui.shared.address_slots import AddressSlots, SlotRefused

BUSY_RETRY_S = 5
ADDRESS_REFUSAL = ("Other requests with pictures from your network are still arriving. Wait for them, then send "
                   "this one again.")
PAGE_REFUSAL = "The server is receiving many pictures right now. Please send yours again in a few seconds."


class ApiBodies:
    def __init__(self, small_bytes: int, max_bytes: int, total_bytes: int, per_address: int):
        self.small_bytes, self.max_bytes, self.total_bytes = small_bytes, max_bytes, total_bytes
        self.slots = AddressSlots(per_address, ADDRESS_REFUSAL)
        self._held = 0
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def reading(self, address: str, declared: int | None) -> Iterator[None]:
        """Hold room for one body of ``declared`` bytes (None: not declared, so counted at the cap) while it is read
        and parsed; raises ``ApiError`` (429 for the address, 503 for the page) when there is none."""
        size = self.max_bytes if declared is None else min(declared, self.max_bytes)
        if size <= self.small_bytes:
            yield
            return
        try:
            self.slots.acquire(address)
        except SlotRefused as exc:
            raise ApiError(429, exc.user_message, "address_busy", retry_after_s=BUSY_RETRY_S) from None
        try:
            with self._lock:
                fits = self._held + size <= self.total_bytes
                if fits:
                    self._held += size
            if not fits:
                raise ApiError(503, PAGE_REFUSAL, "busy", retry_after_s=BUSY_RETRY_S)
            try:
                yield
            finally:
                with self._lock:
                    self._held -= size
        finally:
            self.slots.release(address)
