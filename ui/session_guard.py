"""Two of Gradio's routes act on a whole tab by its session hash alone; here they need more than the hash.

A tab's session hash is made up by its client and sent in every request, so Owlet never treats it as an identity
(``ui.identity``). Gradio does, in two places that could end another tab's answers:

- ``POST /gradio_api/cancel`` ends *every* running task of ``(session_hash, fn_index)`` before it looks at the
  ``event_id`` it was given (and, for an id that is not pending, never tells the tab's client that its event
  ended, so that client waits forever). The page's own client only cancels events it started, so a cancel passes
  here only when its ``event_id`` is one of that session's pending events; the hash alone cancels nothing.
- ``GET /gradio_api/heartbeat/<session_hash>``: when one closes, Gradio marks every pending event of that session
  closed (that is how a closed tab stops its answer), whichever connection it was. A second heartbeat of a session
  that already holds one is refused, so nobody else can open one beside a tab's own and close it.

And one that costs the page more than it should: ``GET /gradio_api/queue/data`` for a session the queue does not
know starts a 200 stream, then fails inside it with a logged traceback (about 9 ms of the event loop and 6 KB of
log a request, against under 1 ms for a plain 404). It is answered 404 here, before Gradio runs, as Gradio would
have answered it.

What the hash still gives its holder is documented in the README ("Running it in public").
"""
from __future__ import annotations

import json
import threading
from urllib.parse import parse_qs

from starlette.responses import JSONResponse, PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CANCEL_PATH = "/gradio_api/cancel"
HEARTBEAT_PREFIX = "/gradio_api/heartbeat/"
QUEUE_DATA_PATH = "/gradio_api/queue/data"
NOT_PENDING = "No such event is running in this session."
HEARTBEAT_TAKEN = "This page session is already open in another connection. Reload the page."


class SessionGuard:
    """ASGI middleware over Gradio's app; ``queue`` is the page's Gradio ``Queue`` (its pending events)."""

    def __init__(self, app: ASGIApp, queue) -> None:
        self.app, self.queue = app, queue
        self._heartbeats: set[str] = set()
        self._lock = threading.Lock()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = scope.get("path", "")
            if path == CANCEL_PATH and scope.get("method") == "POST":
                return await self._cancel(scope, receive, send)
            if path.startswith(HEARTBEAT_PREFIX) and scope.get("method") == "GET":
                return await self._heartbeat(path[len(HEARTBEAT_PREFIX):].strip("/"), scope, receive, send)
            if path == QUEUE_DATA_PATH and not self.has_messages(scope.get("query_string", b"")):
                return await PlainTextResponse("Session not found.", status_code=404)(scope, receive, send)
        await self.app(scope, receive, send)

    async def _cancel(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The body is small (the page's body limits sit outside this middleware): read it, check it, replay it.
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if not self.is_pending(body):
            return await JSONResponse({"success": False, "detail": NOT_PENDING}, status_code=404)(scope, receive, send)
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, replay, send)

    def is_pending(self, body: bytes) -> bool:
        """Whether the cancel in ``body`` names an event that is pending in the session it names."""
        try:
            request = json.loads(body)
            session_hash, event_id = request["session_hash"], request["event_id"]
        except (ValueError, TypeError, KeyError):
            return False
        if not isinstance(session_hash, str) or not isinstance(event_id, str):
            return False
        pending = getattr(self.queue, "pending_event_ids_session", {}).get(session_hash) or ()
        return event_id in pending

    def has_messages(self, query_string: bytes) -> bool:
        """Whether the queue holds a message queue for the session a queue-data request names."""
        session_hash = parse_qs(query_string.decode("latin-1")).get("session_hash", [""])[0]
        return session_hash in getattr(self.queue, "pending_messages_per_session", {})

    async def _heartbeat(self, session_hash: str, scope: Scope, receive: Receive, send: Send) -> None:
        with self._lock:
            taken = session_hash in self._heartbeats
            self._heartbeats.add(session_hash)
        if taken:
            return await PlainTextResponse(HEARTBEAT_TAKEN, status_code=409)(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        finally:
            with self._lock:
                self._heartbeats.discard(session_hash)
