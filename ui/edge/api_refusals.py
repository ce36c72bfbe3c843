"""The edge's refusals of API requests, as OpenAI error objects.

A request to the OpenAI-compatible API (``/v1/...``) meets the same edge as every other: a route that is not open
(404), a body over its cap (413), too many held connections from one address (429), and so on. Those middlewares
answer the page's clients in plain text; an API client's library expects ``{"error": {"message", "type", "param",
"code"}}``. This middleware, outermost, rewrites any error response on an API path that is not already such an
object into one, keeping its status, its sentence and its headers (``Retry-After`` above all), with the code of the
limit that refused it (``ui.shared.refusals``), so a client tells an open-request cap from a rate limit. Successful
responses and the API's own errors pass through untouched.
"""
from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ui.shared.openai_errors import error_body, is_error_body
from ui.shared.refusals import code_of
from ui.shared.route_paths import API_PREFIX

MAX_REFUSAL_BYTES = 64 * 1024  # a refusal is a sentence; anything longer is passed on as it is
_CODES = {401: "invalid_api_key", 404: "unknown_route", 405: "method_not_allowed", 411: "length_required",
          413: "request_too_large", 429: "too_many_requests"}  # by status, when no limit named itself


class ApiErrors:
    """ASGI middleware: error responses on ``/v1/`` paths become OpenAI error objects."""

    def __init__(self, app: ASGIApp, max_body_bytes: int):
        self.app, self.max_body_bytes = app, max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope.get("path", "").startswith(API_PREFIX):
            return await self.app(scope, receive, send)
        held: Message | None = None  # an error's response start, held until its body is in
        body = b""
        passing = False

        async def reshaping_send(message: Message) -> None:
            nonlocal held, body, passing
            if passing:
                return await send(message)
            if message["type"] == "http.response.start":
                if message["status"] < 400:
                    passing = True
                    return await send(message)
                held = message
                return None
            body += message.get("body", b"")
            if len(body) > MAX_REFUSAL_BYTES:
                passing = True
                await send(held)
                return await send({**message, "body": body})
            if not message.get("more_body", False):
                passing = True
                await _send_refusal(send, held, body, self.max_body_bytes, code_of(scope))
        await self.app(scope, receive, reshaping_send)


async def _send_refusal(send: Send, start: Message, body: bytes, max_body_bytes: int, code: str | None) -> None:
    status = start["status"]
    if is_error_body(body):
        await send(start)
        return await send({"type": "http.response.body", "body": body, "more_body": False})
    reshaped = json.dumps(error_body(status, _sentence(body, status, max_body_bytes),
                                     code or _CODES.get(status))).encode()
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() not in (b"content-type", b"content-length")]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(reshaped)).encode())]
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": reshaped, "more_body": False})


def _sentence(body: bytes, status: int, max_body_bytes: int) -> str:
    """The refusal's own words: its text, or the ``detail`` of a JSON one (FastAPI's)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = None
    if isinstance(parsed, dict) and "detail" in parsed:
        detail = parsed["detail"]
        text = detail if isinstance(detail, str) else json.dumps(detail)
    if status == 404 and text in ("", "Not found.", "Not Found"):
        return "No such API route. Owlet serves POST /v1/chat/completions, GET /v1/models and GET /v1/key."
    if status == 413 and text in ("", "Content Too Large"):
        return (f"The request is larger than this server takes ({max_body_bytes / 2**20:.0f} MB, pictures as base64 "
                "included). Send fewer or smaller pictures.")
    return text or f"The request was refused (HTTP {status})."
