"""A request body read whole by a middleware, then handed on to the app as if it had not been read.

Several of the page's middlewares must see a small body before Gradio does (a session hash to budget or bind, a
user name to count sign-ins under); the page's body limits (``ui.edge.body_limits``) sit outside all of them, so the
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


MAX_JSON_DEPTH = 64  # no request the page or an API client makes nests deeper than a few levels
# Lists and objects in one body, counted from its brackets before parsing (a question's own brackets included: at
# most max_text_chars of them). 96 KB of "[[[...]]]" made 48k containers: 20-190 ms of the event loop a request,
# garbage collections included, and eight connections of one address slowed everyone's answers to seconds.
MAX_JSON_CONTAINERS = 8192
_PARSED = "owlet.request_json"  # where the parsed body is kept in the ASGI scope (see json_object)


def json_object(body: bytes, scope: dict | None = None) -> dict | None:
    """The body as a JSON object, or None when it is not one (not JSON, not an object, or nested deeper than
    ``MAX_JSON_DEPTH``, which Python's parser may not even survive: RecursionError).

    Given the request's ``scope``, the body is parsed once per request: every middleware that looks at it shares
    that parse. Parsed by each middleware, a body would be parsed four times before Gradio's own, and a client
    posting megabyte bodies from four connections would hold the event loop that streams everyone's answers."""
    if scope is not None:
        kept = scope.get(_PARSED)
        if kept is not None and kept[0] == body:
            return kept[1]
    try:
        too_many = body.count(b"[") + body.count(b"{") > MAX_JSON_CONTAINERS  # counted at C speed, unparsed
        value = json.loads(body) if body and not too_many else None
    except (ValueError, RecursionError):
        value = None
    if not isinstance(value, dict) or _deeper_than(value, MAX_JSON_DEPTH):
        value = None
    if scope is not None:
        scope[_PARSED] = (body, value)
    return value


def _deeper_than(value, limit: int) -> bool:
    """Whether ``value`` nests containers more than ``limit`` deep (iterative: no recursion to exhaust)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > limit:
            return True
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def session_hash_of(request: dict | None) -> str | None:
    """A parsed body's ``session_hash`` (None when absent or unreadable: Gradio then makes a new session, or
    refuses the body itself)."""
    value = (request or {}).get("session_hash")
    return value if isinstance(value, str) and value else None
