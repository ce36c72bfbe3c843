"""Operations endpoints served next to the page: ``/healthz`` and ``/metrics`` (Prometheus text format).

They are plain Starlette routes handed to Gradio's FastAPI app at construction, so they work with
``launch()`` (including ``--share``) and need no second port. Both are private by design:

- ``/metrics`` answers only to ``Authorization: Bearer <OWLET_UI_METRICS_TOKEN>``; with no token configured
  it is off (404). It carries aggregates only: no user, address or worker labels.
- ``/healthz`` tells anyone ``{"ok": true|false}`` (for load balancers and compose), and tells a caller with
  the metrics token why, with worker names.
"""
from __future__ import annotations

import hmac
import math

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ui.request_body import buffered
from ui.session_budget import SessionLedger

METRICS_OFF = "metrics are off: set OWLET_UI_METRICS_TOKEN and scrape with that bearer token\n"


def authorised(request, token: str) -> bool:
    """True when ``token`` is configured and the request carries it as a bearer token."""
    if not token:
        return False
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), token.encode())


def ops_routes(client, metrics, metrics_token: str = "") -> list[Route]:
    """Routes for ``App(routes=...)``; both read Redis in a thread so the event loop never blocks."""

    async def healthz(request):
        try:
            health = await run_in_threadpool(client.health)
        except Exception as exc:  # Redis refusing connections can surface here rather than as redis=False
            health = {"redis": False, "workers": [], "detail": type(exc).__name__}
        workers = [w.get("worker") for w in health.get("workers", [])]
        ok = bool(health.get("redis")) and len(workers) >= 1
        body = {"ok": ok}
        if authorised(request, metrics_token):
            body.update(redis=bool(health.get("redis")), workers=workers, queued=health.get("queued"))
            if not health.get("redis"):
                body["reason"] = "Redis is not reachable"
            elif not workers:
                body["reason"] = "no worker heartbeat is alive"
        return JSONResponse(body, status_code=200 if ok else 503)

    async def prometheus(request):
        if not metrics_token:
            return PlainTextResponse(METRICS_OFF, status_code=404)
        if not authorised(request, metrics_token):
            return PlainTextResponse("unauthorised\n", status_code=401, headers={"WWW-Authenticate": "Bearer"})
        payload = await run_in_threadpool(metrics.render)
        return Response(payload, media_type=CONTENT_TYPE_LATEST)

    return [Route("/healthz", healthz, methods=["GET"]), Route("/metrics", prometheus, methods=["GET"])]


# What a visitor needs before logging in: the login page, its static files, and the health check.
_OPEN_PATHS = frozenset({"/", "/login", "/login/", "/login_check", "/login_check/", "/healthz", "/favicon.ico",
                         "/manifest.json", "/theme.css", "/gradio_api/theme.css",
                         "/gradio_api/startup-events"})  # Gradio probes this itself at launch; it says nothing
_OPEN_PREFIXES = ("/assets/", "/static/", "/svelte/", "/gradio_api/static/", "/gradio_api/assets/")


LOGIN_PATHS = ("/login", "/login/")


class LoginAttempts:
    """ASGI middleware for ``--auth``: at most ``ledger.per_address`` sign-in attempts per client address and user
    name per ``ledger.window_s``, so nobody can try passwords at network speed. Every attempt counts, right or
    wrong (a person signs in a few times a day). Keyed by the name too, so guessing at one account from an address
    does not lock the other accounts out there, nor that account's owner elsewhere. The ledger is a
    ``ui.session_budget.SessionLedger`` used without session hashes: a sliding-window count per key. An address
    also has ``ACCOUNTS_PER_ADDRESS`` times that over all names, so made-up names cannot grow the ledger without
    bound."""

    ACCOUNTS_PER_ADDRESS = 5

    def __init__(self, app, ledger, addresses):
        self.app, self.ledger, self.addresses = app, ledger, addresses
        self.per_address = SessionLedger(ledger.per_address * self.ACCOUNTS_PER_ADDRESS, ledger.window_s)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path") not in LOGIN_PATHS:
            return await self.app(scope, receive, send)
        body, replay, complete = await buffered(receive)  # at most the page's request-body cap (ui.body_limits)
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
        response = PlainTextResponse(f"Too many sign-in attempts for this account from your network. Try again in "
                                     f"{retry} s.", status_code=429, headers={"Retry-After": str(retry)})
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


class LoginRequired:
    """ASGI middleware for ``--auth``: nothing but the login page, its assets and ``/healthz`` answers without
    a login. Gradio guards its own API routes, but not everything it serves (``/openapi.json``,
    ``/gradio_api/cancel``, ``/gradio_api/heartbeat``), nor routes added next to it; this closes them all."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or self._open(scope) or self._logged_in(scope):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        response = JSONResponse({"detail": {"error": "Not authenticated"}}, status_code=401)
        return await response(scope, receive, send)

    @staticmethod
    def _open(scope) -> bool:
        path = scope.get("path", "")
        return path in _OPEN_PATHS or path.startswith(_OPEN_PREFIXES)

    @staticmethod
    def _logged_in(scope) -> bool:
        app = scope.get("app")  # Gradio's App: set by Starlette before the middleware stack runs
        tokens, cookie_id = getattr(app, "tokens", None), getattr(app, "cookie_id", None)
        if not tokens:
            return False
        cookies = {}
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                for part in value.decode("latin-1").split(";"):
                    key, _, val = part.strip().partition("=")
                    cookies[key] = val
        token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
        return token is not None and token in tokens
