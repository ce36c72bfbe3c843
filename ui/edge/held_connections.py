"""Requests that stay open: at most a few per client address, and request bodies that must arrive in time.

Some of the page's routes hold their connection for as long as the client likes: the tab's heartbeat stream
(``/gradio_api/heartbeat/<session>``), the queue's event stream (``/gradio_api/queue/data``), an API call's result
stream (``GET /gradio_api/call/<api>/<event>``), and any POST whose body trickles in (an upload, or a JSON body
under its 1 MiB cap: uvicorn has no timeout for reading a body). None of them costs a page event, so the
per-address event cap does not see them: one address could open thousands, each a file descriptor and a task on
the one event loop that streams every answer, until the process ran out of descriptors (1,024 by default) and
nobody could connect.

So each address may hold ``per_address`` of each kind at once (heartbeats, answer streams, bodies arriving; a browser
tab holds one or two; more is refused with 429, a sentence and the code ``too_many_open_requests``: it frees when one
of them ends, so ``Retry-After`` is a short interval, not a window), and a POST's body must have arrived within
``upload_timeout_s`` of its start, or the page treats the client as gone (Gradio abandons an upload and removes its
partial file).

An answer of the OpenAI-compatible API (``POST /v1/chat/completions``) is a stream too, for as long as it lasts; its
body must arrive in time like any other.

Any other GET holds its connection for as long as its response takes to be read: a client that asks for the page's
largest script (4.6 MB) or an uploaded picture and never reads the answer keeps a descriptor and up to a socket buffer
of kernel memory (200 held from one address: 400 descriptors and 750 MB of TCP memory on loopback). Those are downloads,
with a cap of their own, ``per_address_downloads``: higher, because one page load fetches dozens of files, and a proxy
speaking HTTP/2 to browsers may fetch many of them at once. Requests whose headers never finish never reach the
application at all; ``ui.edge.header_deadline`` closes those. The addresses are ``ui.identity.ClientAddresses``'s, as
for every other per-address limit: behind a front the page believes (a trusted proxy, the share link), each
visitor's own (docs/security.md, "Who is who").
"""
from __future__ import annotations

import asyncio
import threading

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.identity import DIRECT, ClientAddresses
from ui.shared.refusals import OPEN_REQUEST_RETRY_S, TOO_MANY_OPEN_REQUESTS, refusal
from ui.shared.route_paths import CHAT_COMPLETIONS_PATH

CALL_PREFIX = "/gradio_api/call/"


# What a held request holds, each with its own cap per address, so one kind cannot crowd out another: idle
# heartbeats (which need no session and cost no event) must not leave a tab on the same address without a place
# to send its question or to receive its answer.
HEARTBEAT, STREAM, BODY, DOWNLOAD = "heartbeat", "stream", "body", "download"
_REFUSALS = {
    HEARTBEAT: "Too many open tabs of this page from your network (at most {n} at once). Close some, then reload.",
    STREAM: "Too many answers being received from your network (at most {n} streams at once). Wait for some to "
            "finish, then try again.",
    BODY: "Too many uploads or requests arriving from your network (at most {n} at once). Wait for them to "
          "finish, then try again.",
    DOWNLOAD: "Too many downloads from this page to your network at once (at most {n}). Wait a moment, then "
              "reload.",
}


def held_kind(scope: Scope) -> str | None:
    """What this request holds while it stays open, or None for a request that cannot stay open."""
    path, method = scope.get("path", ""), scope.get("method", "")
    if method == "POST":  # an API answer; or an upload or a JSON body, held while its body arrives
        return STREAM if path == CHAT_COMPLETIONS_PATH else BODY
    if method != "GET":
        return None
    if path.startswith("/gradio_api/heartbeat/"):
        return HEARTBEAT
    if path.startswith("/gradio_api/queue/data"):
        return STREAM
    if path.startswith(CALL_PREFIX) and path[len(CALL_PREFIX):].strip("/").count("/") >= 1:  # <api>/<event>
        return STREAM
    return DOWNLOAD  # held until its response has been read


class HeldConnections:
    """ASGI middleware: per client address, ``per_address`` requests of each held kind at once (a POST counts
    only while its body arrives) and ``per_address_downloads`` downloads; POST bodies (uploads above all) within
    ``upload_timeout_s``."""

    def __init__(self, app: ASGIApp, per_address: int, upload_timeout_s: float,
                 addresses: ClientAddresses = DIRECT, per_address_downloads: int | None = None):
        self.app, self.upload_timeout_s, self.addresses = app, upload_timeout_s, addresses
        self.caps = {HEARTBEAT: per_address, STREAM: per_address, BODY: per_address,
                     DOWNLOAD: per_address_downloads or 4 * per_address}
        self._open: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = held_kind(scope) if scope["type"] == "http" else None
        if kind is None:
            return await self.app(scope, receive, send)
        key, cap = (kind, self.addresses.of(Request(scope))), self.caps[kind]
        with self._lock:
            held = self._open.get(key, 0)
            if held < cap:
                self._open[key] = held + 1
        if held >= cap:
            return await refusal(scope, TOO_MANY_OPEN_REQUESTS, _REFUSALS[kind].format(n=cap),
                                 retry_after_s=OPEN_REQUEST_RETRY_S)(scope, receive, send)
        released = False

        def release() -> None:
            nonlocal released
            if released:
                return
            released = True
            with self._lock:
                left = self._open.get(key, 1) - 1
                if left > 0:
                    self._open[key] = left
                else:
                    self._open.pop(key, None)
        try:
            if scope["method"] == "POST":  # a body counts as held only until it has arrived; a stream, to its end
                receive = self._body_deadline(receive, on_complete=release if kind == BODY else lambda: None)
            await self.app(scope, receive, send)
        finally:
            release()

    def _body_deadline(self, receive: Receive, on_complete) -> Receive:
        """``receive`` that reports a disconnect once the body has not fully arrived by the deadline, and calls
        ``on_complete`` when the body is in (or given up on): from then on the request holds nothing of ours."""
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
                message = {"type": "http.disconnect"}
            if message["type"] != "http.request" or not message.get("more_body", False):
                complete = True
                on_complete()
            return message
        return timed_receive
