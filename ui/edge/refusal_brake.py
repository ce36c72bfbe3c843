"""Refused requests are limited too: an address that keeps asking after its refusals is slowed, at little cost.

Every refusal says when to come back (``Retry-After``, or the sentence). A client that ignores it and asks again at
once, unslowed, is refused about 120 times a second, and each time the page reads the request, checks it against the
per-address slots and runs Redis's admission script.

So the page counts the refusals each address receives, in a sliding window (``address_refusals`` per
``address_refusals_window_s``): every 429 and 503 it answers to a request that asks for something (a POST: a turn, an
API request, an upload, a sign-in), and the refusals the chat handlers put in a turn's status line
(``RefusalLedger.note``). A GET is not counted: a health check polling ``/healthz`` while no worker is up gets 503
every time, and asks for nothing. Past that count the address is *braked* until its oldest refusal leaves the window:

- its asking requests on the edge (a chat completion of the API, an upload) are refused before anything reads their
  body, with the code ``refusals_limited`` and ``Retry-After``, each after ``BRAKE_DELAY_S``, at most
  ``BRAKED_AT_ONCE`` at a time per address (more are refused at once): a client that loops on its refusals asks
  about once a second, and one that opens many connections costs the page only their headers;
- its turns on the page (``/chat``, retry, edit) get the same sentence in their status line after the same delay,
  while each holds one of the address's answer slots (``ChatHandlers``).

A braked refusal is not counted again, so a braked client still meets the real limits at the window's rate and is
never braked for longer than the window; a client that waits as it is told is never braked at all. Requests that
read (the page, its files, answer streams, heartbeats) are never braked: a tab at the same address keeps its answer.
People behind one address share the count, as they share every per-address limit.
"""
from __future__ import annotations

import asyncio
import math
import threading
import time
from collections import Counter, deque

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.identity import DIRECT, ClientAddresses
from ui.shared.refusals import REFUSALS_LIMITED, code_of, refusal
from ui.shared.route_paths import CHAT_COMPLETIONS_PATH, UPLOAD_PATH

BRAKE_DELAY_S = 1.0  # how long a braked request waits for its refusal
BRAKED_AT_ONCE = 4  # braked edge requests one address may have waiting for their refusal; more are refused at once
REFUSED_STATUSES = (429, 503)
BRAKED_PATHS = frozenset({CHAT_COMPLETIONS_PATH, UPLOAD_PATH})  # asking requests the edge sees whole


def braked_sentence(wait_s: float) -> str:
    return (f"Too many refused requests from your network: each refusal says when to ask again. Please wait "
            f"{max(1, math.ceil(wait_s))} s before asking again.")


class RefusalLedger:
    """Per address, the times of its latest refusals within the window (at most ``per_address`` kept), and whether
    it is braked (thread-safe: the edge runs on the event loop, handlers on threads too). ``counted``, a Prometheus
    counter with a ``reason`` label, counts every refusal noted and every braked one."""

    def __init__(self, per_address: int, window_s: float, clock=time.monotonic, counted=None):
        assert per_address >= 1 and window_s > 0
        self.per_address, self.window_s, self._clock, self.counted = per_address, window_s, clock, counted
        self._times: dict[str, deque] = {}
        self._next_sweep = clock() + window_s
        self._lock = threading.Lock()

    def note(self, address: str, reason: str) -> None:
        """``address`` was refused (for ``reason``, the refusal's code)."""
        now = self._clock()
        with self._lock:
            self._times.setdefault(address, deque(maxlen=self.per_address)).append(now)
            if now >= self._next_sweep:
                self._sweep(now)
        self._count(reason)

    def braked_for(self, address: str) -> float | None:
        """Seconds until ``address`` may ask again, or None when it is not braked."""
        now = self._clock()
        with self._lock:
            times = self._times.get(address)
            if times is None or len(times) < self.per_address or times[0] <= now - self.window_s:
                return None
            return times[0] + self.window_s - now

    def braked(self) -> None:
        """A braked request was refused (counted, not noted: the address's window is not prolonged)."""
        self._count(REFUSALS_LIMITED)

    def _count(self, reason: str) -> None:
        if self.counted is not None:
            self.counted.labels(reason).inc()

    def _sweep(self, now: float) -> None:
        """Forget addresses with nothing in the window, so the ledger does not grow with every address ever seen."""
        for address in [a for a, times in self._times.items() if not times or times[-1] <= now - self.window_s]:
            del self._times[address]
        self._next_sweep = now + self.window_s


class RefusalBrake:
    """ASGI middleware: counts the refusals the page answers to each address's POSTs, and brakes an address past its
    count (see the module notes)."""

    def __init__(self, app: ASGIApp, ledger: RefusalLedger, addresses: ClientAddresses = DIRECT):
        self.app, self.ledger, self.addresses = app, ledger, addresses
        self._waiting: Counter[str] = Counter()  # braked requests waiting for their refusal, per address

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        address = self.addresses.of(Request(scope))
        if scope.get("path") in BRAKED_PATHS:
            wait_s = self.ledger.braked_for(address)
            if wait_s is not None:
                return await self._brake(scope, receive, send, address, wait_s)

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in REFUSED_STATUSES:
                status = message["status"]
                self.ledger.note(address, code_of(scope) or ("too_many_requests" if status == 429 else "busy"))
            await send(message)
        await self.app(scope, receive, counting_send)

    async def _brake(self, scope: Scope, receive: Receive, send: Send, address: str, wait_s: float) -> None:
        self.ledger.braked()
        if self._waiting[address] < BRAKED_AT_ONCE:
            self._waiting[address] += 1
            try:
                await asyncio.sleep(BRAKE_DELAY_S)
            finally:
                self._waiting[address] -= 1
                if self._waiting[address] <= 0:
                    del self._waiting[address]
            wait_s = self.ledger.braked_for(address) or 0.0
        await refusal(scope, REFUSALS_LIMITED, braked_sentence(wait_s), retry_after_s=wait_s)(scope, receive, send)
