"""A request body read whole by a middleware, then handed on to the app as if it had not been read.

Several of the page's middlewares must see a small body before Gradio does (a session hash to budget or bind, a
user name to count sign-ins under); the page's body limits (``ui.body_limits``) sit outside all of them, so the
whole body is bounded.
"""
from __future__ import annotations

import json

from starlette.types import Message, Receive


async def buffered(receive: Receive) -> tuple[bytes, Receive, bool]:
    """Read the whole request body. Returns it, a ``receive`` that hands the same body (and then a disconnect,
    if the client left) to the app, and whether the body arrived whole."""
    chunks, more, last = [], True, None
    while more:
        last = await receive()
        if last["type"] != "http.request":
            break  # the client went away: the app will see that too
        chunks.append(last.get("body", b""))
        more = last.get("more_body", False)
    body = b"".join(chunks)
    complete = last is not None and last["type"] == "http.request"
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if not complete and last is not None:
        pending.append(last)

    async def replay() -> Message:
        return pending.pop(0) if pending else await receive()

    return body, replay, complete


def replaying(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands ``body`` (one the middleware rewrote) to the app, then whatever comes next."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}
    return replay


def json_object(body: bytes) -> dict | None:
    """The body as a JSON object, or None when it is not one."""
    try:
        value = json.loads(body) if body else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def session_hash_of(body: bytes) -> str | None:
    """The body's ``session_hash`` (None when absent or unreadable: Gradio then makes a new session, or refuses
    the body itself)."""
    value = (json_object(body) or {}).get("session_hash")
    return value if isinstance(value, str) and value else None
