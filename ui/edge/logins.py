"""Sign-ins with ``--auth``: a budget of attempts per address and account, and nothing served without a login.

Gradio checks passwords with no limit on how often, and guards its own API routes but not everything it serves.
These two ASGI middlewares run only when the page has logins (``--auth``/``OWLET_UI_AUTH``).
"""
from __future__ import annotations

import math

from starlette.requests import Request
from starlette.responses import JSONResponse

from ui.edge.request_body import buffered
from ui.edge.tab_budget import NewTabLedger
from ui.gradio_adapters.internals import login_cookie_names, login_tokens
from ui.shared.refusals import TOO_MANY_LOGINS, refusal
from ui.shared.route_paths import API_PREFIX

# What a visitor needs before logging in: the login page, its static files, and the health check; and /metrics,
# which answers only to its own bearer token (ui.ops.endpoints): Prometheus scrapes with that token alone.
_OPEN_PATHS = frozenset({"/", "/login", "/login/", "/login_check", "/login_check/", "/healthz", "/metrics",
                         "/favicon.ico", "/manifest.json", "/theme.css", "/gradio_api/theme.css",
                         "/gradio_api/startup-events"})  # Gradio probes this itself at launch; it says nothing
_OPEN_PREFIXES = ("/assets/", "/static/", "/svelte/", "/gradio_api/static/", "/gradio_api/assets/",
                  API_PREFIX)  # the OpenAI-compatible API answers only to its own keys (ui.api.api_keys)


LOGIN_PATHS = ("/login", "/login/")


class LoginAttempts:
    """ASGI middleware for ``--auth``: at most ``ledger.per_address`` sign-in attempts per client address and user
    name per ``ledger.window_s``, so nobody can try passwords at network speed. Every attempt counts, right or
    wrong (a person signs in a few times a day). Keyed by the name too, so guessing at one account from an address
    does not lock the other accounts out there, nor that account's owner elsewhere. The ledger is a
    ``ui.edge.tab_budget.NewTabLedger`` used without session hashes: a sliding-window count per key. An address
    also has ``ACCOUNTS_PER_ADDRESS`` times that over all names, so made-up names cannot grow the ledger without
    bound."""

    ACCOUNTS_PER_ADDRESS = 5

    def __init__(self, app, ledger, addresses):
        self.app, self.ledger, self.addresses = app, ledger, addresses
        self.per_address = NewTabLedger(ledger.per_address * self.ACCOUNTS_PER_ADDRESS, ledger.window_s)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in LOGIN_PATHS:
            return await self.app(scope, receive, send)
        body, replay, complete = await buffered(receive)  # at most the page's request-body cap (ui.edge.body_limits)
        if not complete:
            return  # the client left
        username = await _form_field(scope, body, "username")
        address = self.addresses.of(Request(scope))
        wait_s = self.per_address.admit(address, None)
        if wait_s is None:
            # Gradio strips the name before it checks it: " alice" is alice, and counts as her.
            wait_s = self.ledger.admit(f"{address} {username.strip()[:128]}", None)
        if wait_s is None:
            return await self.app(scope, replay, send)
        retry = max(1, math.ceil(wait_s))
        response = refusal(scope, TOO_MANY_LOGINS, f"Too many sign-in attempts for this account from your network. "
                                                   f"Try again in {retry} s.", retry_after_s=retry)
        await response(scope, replay, send)


async def _form_field(scope, body: bytes, name: str) -> str:
    """One field of a form body (urlencoded or multipart, as browsers send either), or "" if absent or unreadable."""
    try:
        value = (await Request(scope, receive=_once(body)).form()).get(name, "")
    except Exception:  # noqa: BLE001 — a malformed form: Gradio answers it; the limit counts it under ""
        return ""
    return value if isinstance(value, str) else ""


def _once(body: bytes):
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    return receive


def signed_in_login(scope) -> str | None:
    """The login whose Gradio access token the request's cookies carry, or None."""
    app = scope.get("app")  # Gradio's App: set by Starlette before the middleware stack runs
    tokens = login_tokens(app)
    if not tokens:
        return None
    cookies = {}
    for name, value in scope.get("headers", []):
        if name == b"cookie":
            for part in value.decode("latin-1").split(";"):
                key, _, val = part.strip().partition("=")
                cookies[key] = val
    token = next((cookies[name] for name in login_cookie_names(app) if cookies.get(name)), None)
    login = tokens.get(token) if token is not None else None
    return login if isinstance(login, str) and login else None


class LoginRequired:
    """ASGI middleware for ``--auth``: nothing but the login page, its assets, ``/healthz`` and ``/metrics`` (with
    its bearer token) answers without a login. Gradio guards its own API routes, but not everything it serves (``/openapi.json``,
    ``/gradio_api/cancel``, ``/gradio_api/heartbeat``), nor routes added next to it; this closes them all. The
    OpenAI-compatible API's routes check their own keys (a login's key, ``ui.api.api_keys``)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._open(scope) or signed_in_login(scope) is not None:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        response = JSONResponse({"detail": {"error": "Not authenticated"}}, status_code=401)
        return await response(scope, receive, send)

    @staticmethod
    def _open(scope) -> bool:
        path = scope.get("path", "")
        return path in _OPEN_PATHS or path.startswith(_OPEN_PREFIXES)

