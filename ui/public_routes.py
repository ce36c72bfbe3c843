"""Only the routes the page and its API clients use answer; every other route Gradio mounts is 404.

Gradio's app serves far more than a chat page needs, and some of it is open to anyone and costs the host:
``/gradio_api/deep_link`` writes a session's saved inputs to a new file in the upload cache on every call (no
budget sees it, no cleaner removes it: a stranger could fill the disk with a 900 KB "input" a call);
``/gradio_api/component_server`` makes a session entry for any session hash before it looks the function up (a
way around the new-session budget); run history acts with the host's Hugging Face token for "local" requests;
and a later Gradio may add more. So this is an allow-list, not a list of known-bad routes: a route Gradio adds
in a later version is closed until someone decides the page needs it.

What stays open: the page and its static files, its config and API description, the queue (join, data, status),
the direct API routes (``call``, ``run``, ``api``: every event there still passes the page's own budgets), uploads
and their progress, served files (Gradio's own allowed-paths rules apply), heartbeat, cancel and reset (the page's
Stop and a closed tab use them), login, and Owlet's ``/healthz`` and ``/metrics``.
"""
from __future__ import annotations

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

OPEN_PATHS = frozenset({
    "/", "/config", "/config/", "/favicon.ico", "/theme.css", "/manifest.json", "/robots.txt",
    "/login", "/login/", "/logout", "/healthz", "/metrics",
    "/gradio_api/info", "/gradio_api/info/", "/gradio_api/theme.css", "/gradio_api/startup-events",
    "/gradio_api/app_id", "/gradio_api/app_id/", "/gradio_api/user", "/gradio_api/user/",
    "/gradio_api/login_check", "/gradio_api/login_check/",
    "/gradio_api/queue/join", "/gradio_api/queue/data", "/gradio_api/queue/status",
    "/gradio_api/upload", "/gradio_api/upload_progress", "/gradio_api/cancel", "/gradio_api/reset",
    "/gradio_api/reset/",
})
OPEN_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon", "/gradio_api/file=", "/gradio_api/file/",
                 "/gradio_api/heartbeat/", "/gradio_api/call/", "/gradio_api/run/", "/gradio_api/api/")


def is_open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


class PublicRoutes:
    """ASGI middleware: a request for a route outside the allow-list gets 404 before any of Gradio's code runs
    (websockets are closed)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or is_open(scope.get("path", "")):
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await PlainTextResponse("Not found.", status_code=404)(scope, receive, send)
