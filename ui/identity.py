"""Who is asking: the logged-in username when auth is on, otherwise a stable per-browser id.

The browser id is a random token kept in ``gr.BrowserState`` (localStorage, encrypted with the configured
secret), so it survives page reloads and server restarts. Gradio's ``session_hash`` changes on every reload,
so it is only the last resort, for API clients (gradio_client) that have no browser storage.
"""
from __future__ import annotations

import re
import uuid

_BROWSER_ID = re.compile(r"^[0-9a-f]{32}$")


def new_browser_id() -> str:
    return uuid.uuid4().hex


def valid_browser_id(value: object) -> bool:
    """Browser state comes from the client: accept only ids we could have minted."""
    return isinstance(value, str) and bool(_BROWSER_ID.match(value))


def ensure_browser_id(stored: object) -> str:
    """The id already stored in this browser, or a fresh one to store (run on page load)."""
    return stored if valid_browser_id(stored) else new_browser_id()


def resolve_user_id(username: str | None, browser_id: object, session_hash: str | None) -> str:
    """A user id for queues, caps and conversation ownership; prefixes keep the three kinds apart."""
    if username:
        return f"user:{username}"
    if valid_browser_id(browser_id):
        return f"browser:{browser_id}"
    if session_hash:
        return f"session:{session_hash}"
    raise ValueError("no identity: neither a login, a browser id nor a session")


def user_id_from_request(request, browser_id: object) -> str:
    """Same as ``resolve_user_id`` for a ``gr.Request`` (or None outside a request)."""
    username = getattr(request, "username", None) if request is not None else None
    session_hash = getattr(request, "session_hash", None) if request is not None else None
    return resolve_user_id(username, browser_id, session_hash)
