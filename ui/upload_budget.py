"""How many upload bytes one client address, and the whole page, may send in a window of time.

Gradio writes every upload to its cache on disk and keeps it until the cache is cleaned (``delete_cache``:
files older than ``upload_cache_ttl_s``, checked that often, so a file lives up to twice that). Each file is
capped (``max_file_size``), but nothing capped how many: one client posting random 10 MB files as fast as the
network allows would fill the disk within minutes, and then nobody's upload, and on a shared host nothing
else, works. So the page keeps a ledger of the bytes it accepted:

- per client address, at most ``address_upload_bytes`` per ``address_upload_window_s`` (a visitor uploads one
  picture per conversation; the default allows dozens of full-size ones every ten minutes);
- in total, at most ``upload_cache_max_bytes`` over twice the cache TTL, which bounds what the cache holds;
- and per address, at most ``ADDRESS_SHARE_OF_PAGE`` of that total over the same window, so a few addresses
  uploading at their short-window limit cannot keep the page's budget spent.

An upload over either budget gets 429 with a ``Retry-After`` before its body is read. An upload must declare
its size (``Content-Length``, which browsers and ``gradio_client`` always send): the budget is charged
before the body is read, never after it is on disk, and what was declared but never sent is given back when the
request ends. Each upload is charged at least
``ui.upload_cache.MIN_UPLOAD_CHARGE_BYTES``, which also caps how many files one address can make. The ledger is per page process (like ``AddressSlots``).
"""
from __future__ import annotations

import math
import threading
import time
from collections import deque

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.identity import DIRECT, ClientAddresses
from ui.public_routes import UPLOAD_PATH
from ui.upload_cache import MIN_UPLOAD_CHARGE_BYTES


# No address may take more than this share of the page's budget over the page's window: with only the short
# per-address window, three addresses really uploading at their limit (128 MiB per 10 minutes is 1.5 GiB over
# the page's 2 hours) kept the page's 4 GiB spent and everyone else's pictures refused.
ADDRESS_SHARE_OF_PAGE = 1 / 8


class UploadLedger:
    """Sliding-window byte budgets: one per address, one for the page, and each address's share of the page's
    (thread-safe)."""

    def __init__(self, address_bytes: int, address_window_s: float, total_bytes: int, total_window_s: float,
                 clock=time.monotonic, address_share: float = ADDRESS_SHARE_OF_PAGE):
        assert address_bytes > 0 and total_bytes > 0 and address_window_s > 0 and total_window_s > 0
        self.address_bytes, self.address_window_s = address_bytes, address_window_s
        self.total_bytes, self.total_window_s = total_bytes, total_window_s
        self._clock = clock
        self._by_address: dict[str, deque] = {}
        self._total: deque = deque()
        self._total_sum = 0
        self._sums: dict[str, int] = {}
        self.address_share_bytes = max(1, int(total_bytes * address_share))
        self._share_sums: dict[str, int] = {}  # bytes of each address in the page's window
        self._lock = threading.Lock()

    def charge(self, address: str, size: int) -> tuple[str, float] | None:
        """Record ``size`` bytes from ``address`` if both budgets allow it. Otherwise nothing is recorded and
        the answer is (which budget, seconds until the upload would fit)."""
        return self.charge_with_receipt(address, size)[0]

    def charge_with_receipt(self, address: str, size: int) -> tuple[tuple[str, float] | None, list | None]:
        """``charge``, and on success a receipt for ``refund``."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            entries = self._by_address.get(address, ())
            held = self._sums.get(address, 0)
            if held + size > self.address_bytes:
                return ("address", self._wait(entries, held + size - self.address_bytes, self.address_window_s,
                                              now)), None
            share = self._share_sums.get(address, 0)
            if share + size > self.address_share_bytes:
                return ("share", self._wait([e for e in self._total if e[2] == address],
                                            share + size - self.address_share_bytes, self.total_window_s,
                                            now)), None
            if self._total_sum + size > self.total_bytes:
                return ("page", self._wait(self._total, self._total_sum + size - self.total_bytes,
                                           self.total_window_s, now)), None
            # one object in both windows, so a refund corrects both: [time, bytes, address, in the address's
            # window, in the page's window]
            entry = [now, size, address, True, True]
            self._by_address.setdefault(address, deque()).append(entry)
            self._sums[address] = held + size
            self._total.append(entry)
            self._total_sum += size
            self._share_sums[address] = share + size
            return None, entry

    def refund(self, receipt: list, size: int) -> None:
        """Give back up to ``size`` bytes of the charge ``receipt`` stands for: the part of a declared upload that
        never arrived (a client that declares 11 MB and sends nothing must not spend the budget for nothing).
        A charge that has already left its windows has nothing left to give back."""
        with self._lock:
            give = min(max(size, 0), receipt[1])
            if give == 0:
                return
            receipt[1] -= give
            if receipt[3]:
                self._sums[receipt[2]] -= give
            if receipt[4]:
                self._total_sum -= give
                self._share_sums[receipt[2]] -= give

    def _expire(self, now: float) -> None:
        while self._total and self._total[0][0] <= now - self.total_window_s:
            entry = self._total.popleft()
            self._total_sum -= entry[1]
            entry[4] = False
            left = self._share_sums[entry[2]] - entry[1]
            if left > 0:
                self._share_sums[entry[2]] = left
            else:
                del self._share_sums[entry[2]]
        for address in list(self._by_address):
            entries = self._by_address[address]
            while entries and entries[0][0] <= now - self.address_window_s:
                entry = entries.popleft()
                self._sums[address] -= entry[1]
                entry[3] = False
            if not entries:
                del self._by_address[address], self._sums[address]

    @staticmethod
    def _wait(entries, excess: int, window_s: float, now: float) -> float:
        """Seconds until the oldest entries holding ``excess`` bytes leave the window (the window if none)."""
        freed = 0
        for stamp, size, *_ in entries:
            freed += size
            if freed >= excess:
                return max(0.0, stamp + window_s - now)
        return window_s  # the upload alone is bigger than the budget left: a window from now at the latest


class UploadBudget:
    """ASGI middleware charging each upload's declared size to the ledger before its body is read, and giving back,
    when the request ends, what was declared but never received."""

    def __init__(self, app: ASGIApp, ledger: UploadLedger, max_upload_request_bytes: int,
                 addresses: ClientAddresses = DIRECT):
        self.app, self.ledger, self.addresses = app, ledger, addresses
        self.max_upload_request_bytes = max_upload_request_bytes  # bigger ones are refused by ui.body_limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != UPLOAD_PATH:
            return await self.app(scope, receive, send)
        request = Request(scope)
        declared = request.headers.get("content-length", "")
        if not declared.isdigit():
            return await PlainTextResponse("Uploads need a Content-Length header.", status_code=411)(
                scope, receive, send)
        size = int(declared)
        if size > self.max_upload_request_bytes:  # refused unread by ui.body_limits; nothing to charge
            return await self.app(scope, receive, send)
        # however small, an upload leaves a file and a directory: each costs at least a minimum
        address, charged = self.addresses.of(request), max(size, MIN_UPLOAD_CHARGE_BYTES)
        refused, receipt = self.ledger.charge_with_receipt(address, charged)
        if refused is not None:
            which, wait_s = refused
            retry = max(1, math.ceil(wait_s))
            return await PlainTextResponse(_refusal(which, self.ledger, retry), status_code=429,
                                           headers={"Retry-After": str(retry)})(scope, receive, send)
        received = 0

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message
        try:
            await self.app(scope, counting_receive, send)
        finally:
            self.ledger.refund(receipt, charged - max(received, MIN_UPLOAD_CHARGE_BYTES))


def _refusal(which: str, ledger: UploadLedger, retry_s: int) -> str:
    if which == "address":
        return (f"Upload limit reached: at most {ledger.address_bytes // 2**20} MB of images per "
                f"{_duration(ledger.address_window_s)} from one address. Try again in {_duration(retry_s)}.")
    if which == "share":
        return (f"Upload limit reached: at most {ledger.address_share_bytes // 2**20} MB of images per "
                f"{_duration(ledger.total_window_s)} from one address. Try again in {_duration(retry_s)}.")
    return f"The page is receiving too many uploads right now. Try again in {_duration(retry_s)}."


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds} s" if seconds < 120 else f"{math.ceil(seconds / 60)} min"
