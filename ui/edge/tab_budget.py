"""How many new tabs (Gradio "sessions", each with its own session hash) one client address may open in a window
of time.

Gradio keeps each session's state (Owlet's ``gr.State``: the conversation a tab is in, its images, the answer it
is streaming) in an in-memory LRU of ``state_session_capacity`` sessions (10,000), and any request naming a
session hash it has not seen makes a new entry; an API call without one (``/call/…``, ``/run/…``) gets a fresh
hash of its own. A stranger making ten thousand cheap calls would push every other visitor's tab out of it:
their Stop would stop nothing and their next question would silently start a new conversation while the old
one stayed on screen. A visitor opens one session per tab (a reload makes another), an API client one per
``gradio_client.Client``; so each address may open ``address_new_sessions`` per ``address_new_sessions_window_s``,
and a request that would open one more gets 429 with a sentence and ``Retry-After`` before Gradio sees it.
Sessions in use are never refused: their hashes are remembered per address.
"""
from __future__ import annotations

import math
import re
import threading
import time
from collections import OrderedDict, deque

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ui.edge.request_body import MAX_JSON_CONTAINERS, MAX_JSON_DEPTH, buffered, json_object, session_hash_of
from ui.identity import DIRECT, ClientAddresses
from ui.shared.refusals import TOO_MANY_NEW_TABS, refusal

# Gradio's routes that run an event, and so make a session's state: the queue, and the direct API routes.
_EVENT_ROUTE_MARKERS = ("/queue/join", "/call/", "/run/", "/api/")
# What Gradio's own clients send as a session hash (the page: 11 random characters; gradio_client: a UUID).
# Gradio accepts any string, and keeps it as a key of its session stores: a megabyte-long one would be kept too.
SESSION_HASH = re.compile(r"[A-Za-z0-9_-]{1,64}")
NOT_A_JSON_OBJECT = (f"The request body must be a JSON object (nested at most {MAX_JSON_DEPTH} levels, at most "
                     f"{MAX_JSON_CONTAINERS} lists and objects), like "
                     f'{{"data": [...], "session_hash": "..."}}.')


class NewTabLedger:
    """Per address: the session hashes it has opened (remembered, so reusing one costs nothing) and when, in a
    sliding window (thread-safe)."""

    def __init__(self, per_address: int, window_s: float, remembered_per_address: int | None = None,
                 clock=time.monotonic):
        assert per_address >= 1 and window_s > 0
        self.per_address, self.window_s, self._clock = per_address, window_s, clock
        self._remembered = remembered_per_address or 4 * per_address
        self._opened: dict[str, deque] = {}  # address -> times of the sessions it opened in the window
        self._known: dict[str, OrderedDict] = {}  # address -> its recent session hashes, least recent first
        self._next_sweep = clock() + window_s
        self._lock = threading.Lock()

    def admit(self, address: str, session_hash: str | None) -> float | None:
        """None if the request may go on (a known session, or a new one within the budget, now recorded);
        otherwise the seconds until one more session fits."""
        now = self._clock()
        with self._lock:
            known = self._known.setdefault(address, OrderedDict())
            if session_hash is not None and session_hash in known:
                known.move_to_end(session_hash)
                return None
            opened = self._opened.setdefault(address, deque())
            while opened and opened[0] <= now - self.window_s:
                opened.popleft()
            if len(opened) >= self.per_address:
                return max(0.0, opened[0] + self.window_s - now)
            opened.append(now)
            if session_hash is not None:
                known[session_hash] = now
                while len(known) > self._remembered:
                    known.popitem(last=False)
            if now >= self._next_sweep:
                self._forget_idle(now)
                self._next_sweep = now + self.window_s
            return None

    def _forget_idle(self, now: float) -> None:
        """Drop addresses with nothing in the window, so the ledger does not grow with every address ever seen
        (a session hash of theirs counts as new again, which only costs a place in the budget)."""
        for address in [a for a, opened in self._opened.items() if not opened or opened[-1] <= now - self.window_s]:
            del self._opened[address]
            self._known.pop(address, None)


class NewTabBudget:
    """ASGI middleware: a request that runs an event and opens a new session is charged to its address first."""

    def __init__(self, app: ASGIApp, ledger: NewTabLedger, addresses: ClientAddresses = DIRECT):
        self.app, self.ledger, self.addresses = app, ledger, addresses

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["method"] != "POST"
                or not any(marker in scope["path"] for marker in _EVENT_ROUTE_MARKERS)):
            return await self.app(scope, receive, send)
        body, replay, complete = await buffered(receive)  # bounded: ui.edge.body_limits runs before this
        request = json_object(body, scope)
        if request is None and complete:
            return await PlainTextResponse(NOT_A_JSON_OBJECT, status_code=400)(scope, replay, send)
        session_hash = session_hash_of(request)
        if session_hash is not None and not SESSION_HASH.fullmatch(session_hash):
            return await PlainTextResponse(
                "Malformed session_hash: use up to 64 letters, digits, '-' or '_' (or leave it out).",
                status_code=400)(scope, replay, send)
        wait_s = self.ledger.admit(self.addresses.of(Request(scope)), session_hash)
        if wait_s is not None:
            retry = max(1, math.ceil(wait_s))
            minutes = max(1, math.ceil(self.ledger.window_s / 60))
            return await refusal(
                scope, TOO_MANY_NEW_TABS,
                f"Too many new sessions from your network: at most {self.ledger.per_address} every {minutes} min. "
                f"Keep using the page you have open (API clients: one Client for many calls), or try again in "
                f"{retry} s.", retry_after_s=retry)(scope, replay, send)
        await self.app(scope, replay, send)
