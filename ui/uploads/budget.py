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

An upload over either budget gets 429 with a ``Retry-After`` before its body is read. An upload must declare its size
(``Content-Length``, which browsers and ``gradio_client`` always send): the budget is charged before the body is read,
never after it is on disk, and what was declared but never sent is given back when the request ends (an upload that
ends without being stored gives the page's budget all of it back, as nothing of it stays on disk). Each upload is
charged at least ``ui.uploads.cache_dirs.MIN_UPLOAD_CHARGE_BYTES``, which also caps how many files one address can make.
The ledger is per page process (like ``AddressSlots``).

When an upload would not fit in the page's budget, stored uploads give way to it, each time the oldest of the
address holding the most, those no chat turn has used first (``ui.uploads.room``), so files uploaded only to fill
the budget cannot keep everyone else's out. An address may have ``max_arriving`` uploads arriving at once: a charge
is made before the body arrives, and a body may take the upload timeout, so uploads held open would otherwise hold
the page's budget at no cost.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import deque

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.identity import DIRECT, ClientAddresses
from ui.shared.address_slots import AddressSlots, SlotRefused
from ui.shared.refusals import OPEN_REQUEST_RETRY_S, UPLOAD_BUDGET, UPLOADS_ARRIVING, refusal
from ui.shared.route_paths import UPLOAD_PATH
from ui.uploads.cache_dirs import MIN_UPLOAD_CHARGE_BYTES


# No address may take more than this share of the page's budget over the page's window: with only the short
# per-address window, three addresses really uploading at their limit (128 MiB per 10 minutes is 1.5 GiB over
# the page's 2 hours) kept the page's 4 GiB spent and everyone else's pictures refused.
ADDRESS_SHARE_OF_PAGE = 1 / 8
CHARGE_SCOPE_KEY = "owlet.upload_charge"
ARRIVING_REFUSAL = "Other uploads from your network are still arriving. Wait for them to finish, then upload again."


class Charge:
    """One accepted upload in the ledger (a receipt for ``refund`` and ``release``).

    ``spent`` counts toward its address's budgets: what the address sent. ``held`` counts toward the page's:
    what the upload still holds of the cache on disk, which drops to nothing when the file is deleted early
    (``ui.uploads.room``) while what the address spent stays spent."""

    __slots__ = ("stamp", "spent", "held", "address", "in_address_window", "in_page_window")

    def __init__(self, stamp: float, size: int, address: str):
        self.stamp, self.spent, self.held, self.address = stamp, size, size, address
        self.in_address_window = self.in_page_window = True


class UploadLedger:
    """Sliding-window byte budgets: one per address, one for the page, and each address's share of the page's
    (thread-safe)."""

    def __init__(self, address_bytes: int, address_window_s: float, total_bytes: int, total_window_s: float,
                 clock=time.monotonic, address_share: float = ADDRESS_SHARE_OF_PAGE):
        assert address_bytes > 0 and total_bytes > 0 and address_window_s > 0 and total_window_s > 0
        self.address_bytes, self.address_window_s = address_bytes, address_window_s
        self.total_bytes, self.total_window_s = total_bytes, total_window_s
        self._clock = clock
        self._by_address: dict[str, deque[Charge]] = {}
        self._total: deque[Charge] = deque()
        self._total_sum = 0  # bytes held on disk by the charges in the page's window
        self._sums: dict[str, int] = {}
        self.address_share_bytes = max(1, int(total_bytes * address_share))
        self._share_sums: dict[str, int] = {}  # bytes each address spent in the page's window
        self._lock = threading.Lock()

    def charge(self, address: str, size: int) -> tuple[str, float] | None:
        """Record ``size`` bytes from ``address`` if both budgets allow it. Otherwise nothing is recorded and
        the answer is (which budget, seconds until the upload would fit)."""
        return self.charge_with_receipt(address, size)[0]

    def charge_with_receipt(self, address: str, size: int) -> tuple[tuple[str, float] | None, Charge | None]:
        """``charge``, and on success the ``Charge`` (a receipt for ``refund`` and ``release``)."""
        now = self._clock()
        with self._lock:
            self._expire(now)
            entries = self._by_address.get(address, ())
            held = self._sums.get(address, 0)
            if held + size > self.address_bytes:
                return ("address", self._wait(entries, held + size - self.address_bytes, self.address_window_s,
                                              now, "spent")), None
            share = self._share_sums.get(address, 0)
            if share + size > self.address_share_bytes:
                return ("share", self._wait([e for e in self._total if e.address == address],
                                            share + size - self.address_share_bytes, self.total_window_s,
                                            now, "spent")), None
            if self._total_sum + size > self.total_bytes:
                return ("page", self._wait(self._total, self._total_sum + size - self.total_bytes,
                                           self.total_window_s, now, "held")), None
            # one object in both windows, so a refund or a release corrects both
            entry = Charge(now, size, address)
            self._by_address.setdefault(address, deque()).append(entry)
            self._sums[address] = held + size
            self._total.append(entry)
            self._total_sum += size
            self._share_sums[address] = share + size
            return None, entry

    def page_room(self) -> int:
        """Bytes the page's budget has left now."""
        with self._lock:
            self._expire(self._clock())
            return self.total_bytes - self._total_sum

    def refund(self, receipt: Charge, size: int) -> None:
        """Give back up to ``size`` bytes of the charge ``receipt`` stands for: the part of a declared upload that
        never arrived (a client that declares 11 MB and sends nothing must not spend the budget for nothing).
        A charge that has already left its windows has nothing left to give back."""
        with self._lock:
            give = min(max(size, 0), receipt.spent)
            if give == 0:
                return
            receipt.spent -= give
            if receipt.in_address_window:
                self._sums[receipt.address] -= give
            if receipt.in_page_window:
                self._share_sums[receipt.address] -= give
            self._release(receipt, min(give, receipt.held))

    def release(self, receipt: Charge) -> int:
        """The upload's file was deleted: what it held of the page's budget is free again (its address's budgets
        stay spent). Returns the bytes freed."""
        with self._lock:
            held = receipt.held
            self._release(receipt, held)
            return held if receipt.in_page_window else 0

    def _release(self, receipt: Charge, size: int) -> None:
        receipt.held -= size
        if receipt.in_page_window:
            self._total_sum -= size

    def _expire(self, now: float) -> None:
        while self._total and self._total[0].stamp <= now - self.total_window_s:
            entry = self._total.popleft()
            self._total_sum -= entry.held
            entry.in_page_window = False
            left = self._share_sums[entry.address] - entry.spent
            if left > 0:
                self._share_sums[entry.address] = left
            else:
                del self._share_sums[entry.address]
        for address in list(self._by_address):
            entries = self._by_address[address]
            while entries and entries[0].stamp <= now - self.address_window_s:
                entry = entries.popleft()
                self._sums[address] -= entry.spent
                entry.in_address_window = False
            if not entries:
                del self._by_address[address], self._sums[address]

    @staticmethod
    def _wait(entries, excess: int, window_s: float, now: float, counted: str) -> float:
        """Seconds until the oldest entries holding ``excess`` bytes (their ``counted`` field) leave the window
        (the window if none)."""
        freed = 0
        for entry in entries:
            freed += getattr(entry, counted)
            if freed >= excess:
                return max(0.0, entry.stamp + window_s - now)
        return window_s  # the upload alone is bigger than the budget left: a window from now at the latest


class UploadBudget:
    """ASGI middleware charging each upload's declared size to the ledger before its body is read, and giving back,
    when the request ends, what was declared but never received."""

    def __init__(self, app: ASGIApp, ledger: UploadLedger, max_upload_request_bytes: int,
                 addresses: ClientAddresses = DIRECT, make_room=None, max_arriving: int = 4,
                 arrival_timeout_s: float | None = None):
        self.app, self.ledger, self.addresses = app, ledger, addresses
        # Bytes charged for uploads still arriving, which end within ``arrival_timeout_s`` (the page's upload
        # timeout): a refusal they cause says to come back then, not when the oldest charge leaves the 2-hour window.
        self.arrival_timeout_s, self._arriving_bytes = arrival_timeout_s, 0
        # Uploads one address may have arriving at once. A charge is made before the body is read, and a body may
        # take the upload timeout to arrive: twelve addresses declaring 10 MB uploads and sending nothing held a
        # 256 MiB page budget for two minutes at a time, at no cost.
        self.arriving = AddressSlots(max_arriving, ARRIVING_REFUSAL)
        self.max_upload_request_bytes = max_upload_request_bytes  # bigger ones are refused by ui.edge.body_limits
        # Past the page's budget, ``make_room(bytes)`` may free some by deleting unused uploads
        # (``ui.uploads.room``); returns the bytes it freed.
        self.make_room = make_room

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != UPLOAD_PATH:
            return await self.app(scope, receive, send)
        request = Request(scope)
        declared = request.headers.get("content-length", "")
        if not declared.isdigit():
            return await PlainTextResponse("Uploads need a Content-Length header.", status_code=411)(
                scope, receive, send)
        size = int(declared)
        if size > self.max_upload_request_bytes:  # refused unread by ui.edge.body_limits; nothing to charge
            return await self.app(scope, receive, send)
        # however small, an upload leaves a file and a directory: each costs at least a minimum
        address, charged = self.addresses.of(request), max(size, MIN_UPLOAD_CHARGE_BYTES)
        try:
            self.arriving.acquire(address)
        except SlotRefused as exc:
            return await refusal(scope, UPLOADS_ARRIVING, exc.user_message, retry_after_s=OPEN_REQUEST_RETRY_S)(
                scope, receive, send)
        try:
            await self._charged(scope, receive, send, address, charged)
        finally:
            self.arriving.release(address)

    async def _charged(self, scope: Scope, receive: Receive, send: Send, address: str, charged: int) -> None:
        refused, receipt = self.ledger.charge_with_receipt(address, charged)
        if refused is not None and refused[0] == "page" and self.make_room is not None:
            if await asyncio.to_thread(self.make_room, charged):  # file deletions: off the event loop
                refused, receipt = self.ledger.charge_with_receipt(address, charged)
        if refused is not None:
            which, wait_s = refused
            if which == "page" and self.arrival_timeout_s is not None and \
                    self._arriving_bytes >= charged - self.ledger.page_room():
                wait_s = min(wait_s, self.arrival_timeout_s)
            retry = max(1, math.ceil(wait_s))
            return await refusal(scope, UPLOAD_BUDGET, _refusal(which, self.ledger, retry),
                                 retry_after_s=retry)(scope, receive, send)
        scope[CHARGE_SCOPE_KEY] = receipt  # for ui.uploads.owners, which learns the stored file's path
        received, stored = 0, False
        self._arriving_bytes += charged

        async def noting_send(message: Message) -> None:
            nonlocal stored
            if message["type"] == "http.response.start":
                stored = 200 <= message["status"] < 300
            await send(message)

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message
        try:
            await self.app(scope, counting_receive, noting_send)
        finally:
            self._arriving_bytes -= charged
            self.ledger.refund(receipt, charged - max(received, MIN_UPLOAD_CHARGE_BYTES))
            if not stored:  # refused or ended early: nothing of it is on disk (ui.gradio_adapters.upload_parser), so
                self.ledger.release(receipt)  # the page's budget has its bytes back; the address's stay spent


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
