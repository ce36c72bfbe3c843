"""A request whose own content makes Gradio's API code raise gets 400 and a sentence, not 500 and a traceback.

Gradio looks an endpoint up, and binds a call's named arguments, with code that raises on what a client sends: an
unknown ``api_name`` (``/gradio_api/call/nope``, ``/run/nope``, ``/call/v2/nope``), an unknown argument name on
``/call/v2/<api>``, an upload whose ``files`` field is not a file. Each answered 500 and wrote a traceback of a few
KB to the log, so a stranger could fill the disk at request speed. Here the exception
is caught where it leaves Gradio, before any byte of a response went out, logged as one line, and answered with
400. A response already started is left as it is (the exception goes on up), except the queue's event stream,
which then ends quietly with one budgeted log line. An upload the disk has no room for is no fault of the client's: it
gets 503 and a sentence saying so, and the log an error naming the folder (the parts written are deleted,
``ui.gradio_adapters.upload_parser``).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.shared.log_budget import LogBudget, first_line
from ui.shared.refusals import STORAGE_FULL, refusal
from ui.shared.route_paths import UPLOAD_PATH

log = logging.getLogger("owlet.ui")
refusals = LogBudget(log)

DIRECT_ROUTES = ("/gradio_api/run/", "/gradio_api/api/")
EVENT_STREAM = "/gradio_api/queue/data"
API_ROUTES = ("/gradio_api/call/", "/gradio_api/run/", "/gradio_api/api/", "/gradio_api/upload",
              "/gradio_api/queue/join", EVENT_STREAM)
UNREADABLE = ("This request could not be read: the endpoints this page offers, and what each takes, are listed at "
              "/gradio_api/info.")
NO_ROOM = "The server has no room to store pictures right now. Try again in a few minutes."
NO_ROOM_RETRY_S = 60
FULL = (errno.ENOSPC, errno.EDQUOT)
storage = LogBudget(log, per_minute=2)


class RequestErrors:
    """ASGI middleware, innermost: Gradio's API routes answer a request they cannot handle with 400."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(API_ROUTES):
            return await self.app(scope, receive, send)
        started = False
        outgoing = _refusals_as_400(send) if scope["path"].startswith(DIRECT_ROUTES) else send

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await outgoing(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 — what the client sent broke Gradio's handling of it
            if started and scope["path"].startswith(EVENT_STREAM):
                # Two connections reading one session's event stream: when one ends the session's messages,
                # Gradio raises inside the other's body, and uvicorn logged a 3.4 KB traceback a time, as often
                # as a client liked. The stream ends; one budgeted line says so.
                refusals.warning("ended an event stream Gradio failed mid-response: %s: %s", type(exc).__name__,
                                 first_line(exc))
                with contextlib.suppress(Exception):  # the client may be gone already
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            if started:
                raise
            if scope["path"] == UPLOAD_PATH and isinstance(exc, OSError) and exc.errno in FULL:
                storage.error("refused an upload: the upload folder (GRADIO_TEMP_DIR) is full: %s", first_line(exc))
                return await refusal(scope, STORAGE_FULL, NO_ROOM, status=503, retry_after_s=NO_ROOM_RETRY_S)(
                    scope, receive, send)
            refusals.warning("refused a request Gradio could not handle: %s %s: %s: %s", scope.get("method"),
                             scope.get("path", "")[:100], type(exc).__name__, first_line(exc))
            await PlainTextResponse(UNREADABLE, status_code=400)(scope, receive, send)


def _refusals_as_400(send: Send) -> Send:
    """``send`` for the direct routes (``/run/<api>``, ``/api/<api>``): Gradio answers every failed call there with
    500, the refusals Owlet words for the caller (a ``gr.Error``, whose sentence is the body's ``error``) too. Those
    go out as 400; a 500 whose ``error`` is null (an internal failure, not shown) stays a 500."""
    held: list[Message] = []

    async def rewriting_send(message: Message) -> None:
        if message["type"] == "http.response.start" and message.get("status") == 500:
            held.append(message)
            return
        if not held:
            return await send(message)
        held.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            start, *bodies = held
            body = b"".join(m.get("body", b"") for m in bodies)
            try:
                refused = bool(json.loads(body).get("error"))
            except (ValueError, AttributeError):
                refused = False
            await send({**start, "status": 400} if refused else start)
            await send({"type": "http.response.body", "body": body, "more_body": False})
    return rewriting_send
