"""A request whose own content makes Gradio's API code raise gets 400 and a sentence, not 500 and a traceback.

Gradio looks an endpoint up, and binds a call's named arguments, with code that raises on what a client sends: an
unknown ``api_name`` (``/gradio_api/call/nope``, ``/run/nope``, ``/call/v2/nope``), an unknown argument name on
``/call/v2/<api>``, an upload whose ``files`` field is not a file. Each answered 500 and wrote a traceback of a few
KB to the log, so a stranger could fill the disk at request speed (a hostile audit, 2026-12-03). Here the exception
is caught where it leaves Gradio, before any byte of a response went out, logged as one line, and answered with
400. A response already started is left as it is (the exception goes on up).
"""
from __future__ import annotations

import logging

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("owlet.ui")

API_ROUTES = ("/gradio_api/call/", "/gradio_api/run/", "/gradio_api/api/", "/gradio_api/upload",
              "/gradio_api/queue/join")
UNREADABLE = ("This request could not be read: the endpoints this page offers, and what each takes, are listed at "
              "/gradio_api/info.")


class RequestErrors:
    """ASGI middleware, innermost: Gradio's API routes answer a request they cannot handle with 400."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(API_ROUTES):
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:  # noqa: BLE001 — what the client sent broke Gradio's handling of it
            if started:
                raise
            log.warning("refused a request Gradio could not handle: %s %s: %s: %.200s", scope.get("method"),
                        scope.get("path", "")[:200], type(exc).__name__, exc)
            await PlainTextResponse(UNREADABLE, status_code=400)(scope, receive, send)
