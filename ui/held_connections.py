"""Requests that stay open: at most a few per client address, and request bodies that must arrive in time.

Some of the page's routes hold their connection for as long as the client likes: the tab's heartbeat stream
(``/gradio_api/heartbeat/<session>``), the queue's event stream (``/gradio_api/queue/data``), an API call's result
stream (``GET /gradio_api/call/<api>/<event>``), and any POST whose body trickles in (an upload, or a JSON body
under its 1 MiB cap: uvicorn has no timeout for reading a body). None of them costs a page event, so the
per-address event cap does not see them: one address could open thousands, each a file descriptor and a task on
the one event loop that streams every answer, until the process ran out of descriptors (1,024 by default) and
nobody could connect.

So each address may hold ``per_address`` of these at once (a browser tab holds one or two; more is refused with
429 and a sentence), and a POST's body must have arrived within ``upload_timeout_s`` of its start, or the page
treats the client as gone (Gradio abandons an upload and removes its partial file). Requests whose headers
never finish never reach the application at all; only a proxy in front can time those out (README). The addresses are
``ui.identity.ClientAddresses``'s, as for every other per-address limit. Behind the share link, without trusted
proxies, every visitor is one address (README "Running it in public").
"""
from __future__ import annotations

import asyncio
import threading

from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.identity import DIRECT, ClientAddresses

HELD_GET_PREFIXES = ("/gradio_api/heartbeat/", "/gradio_api/queue/data")
CALL_PREFIX = "/gradio_api/call/"


def is_held(scope: Scope) -> bool:
    """Whether this request may stay open as long as its client wants."""
    path, method = scope.get("path", ""), scope.get("method", "")
    if method == "POST":  # an upload, a JSON body, or /run/<api>, which answers only when its event ends
        return True
    if method != "GET":
        return False
    if path.startswith(HELD_GET_PREFIXES):
        return True
    return path.startswith(CALL_PREFIX) and path[len(CALL_PREFIX):].strip("/").count("/") >= 1  # <api>/<event>


class HeldConnections:
    """ASGI middleware: ``per_address`` held requests per client address at once; POST bodies (uploads above
    all) within ``upload_timeout_s``."""

    def __init__(self, app: ASGIApp, per_address: int, upload_timeout_s: float,
                 addresses: ClientAddresses = DIRECT):
        self.app, self.per_address, self.upload_timeout_s, self.addresses = app, per_address, upload_timeout_s, addresses
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def open_count(self, address: str) -> int:
        with self._lock:
            return self._open.get(address, 0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_held(scope):
            return await self.app(scope, receive, send)
        address = self.addresses.of(Request(scope))
        with self._lock:
            held = self._open.get(address, 0)
            if held < self.per_address:
                self._open[address] = held + 1
        if held >= self.per_address:
            return await PlainTextResponse(
                f"Too many open connections from your network (at most {self.per_address} at once). Close other "
                "tabs of this page, or wait for their answers to finish.", status_code=429,
                headers={"Retry-After": "10"})(scope, receive, send)
        try:
            if scope["method"] == "POST":
                receive = self._body_deadline(receive)
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                left = self._open.get(address, 1) - 1
                if left > 0:
                    self._open[address] = left
                else:
                    self._open.pop(address, None)

    def _body_deadline(self, receive: Receive) -> Receive:
        """``receive`` that reports a disconnect once the body has not fully arrived by the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.upload_timeout_s
        complete = False

        async def timed_receive() -> Message:
            nonlocal complete
            if complete:
                return await receive()
            remaining = deadline - loop.time()
            try:
                if remaining <= 0:
                    raise TimeoutError
                message = await asyncio.wait_for(receive(), remaining)
            except (TimeoutError, asyncio.TimeoutError):
                complete = True
                return {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
            return message
        return timed_receive
