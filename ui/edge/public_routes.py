"""Only the routes the page and its API clients use answer; every other route Gradio mounts is 404.

Gradio's app serves far more than a chat page needs, and some of it is open to anyone and costs the host:
``/gradio_api/deep_link`` writes a session's saved inputs to a new file in the upload cache on every call (no
budget sees it, no cleaner removes it: a stranger could fill the disk with a 900 KB "input" a call);
``/gradio_api/component_server`` makes a session entry for any session hash before it looks the function up (a
way around the new-tab budget); run history acts with the host's Hugging Face token for "local" requests;
and a later Gradio may add more. So this is an allow-list, not a list of known-bad routes: a route Gradio adds
in a later version is closed until someone decides the page needs it.

What stays open: the page and its static files, its config and API description, the queue (join, data, status),
the direct API routes (``call``, ``run``, ``api``: every event there still passes the page's own budgets), uploads,
served files (Gradio's own allowed-paths rules apply), heartbeat, cancel and reset (the page's Stop and a closed
tab use them), login, Owlet's ``/healthz`` and ``/metrics``, and the OpenAI-compatible API's three routes
(``/v1/chat/completions``, ``/v1/models`` with ``/v1/models/<name>``, ``/v1/key``; ``ui.api``), which pass the same
edge and the same per-address slots, caps and queue as the page. No other ``/v1/`` route answers.

Two open routes are narrowed, because what Gradio does with them costs the host and no page needs it:

- **Upload progress is closed, and uploads lose their ``upload_id``.** Gradio keeps an entry per id it is asked
  about (``/gradio_api/upload_progress?upload_id=...`` makes one for any id, up to about 40 KB long, waits 3 s,
  answers 404 and never removes it: open, it grows the page's memory by about 40 KB a request until the page is
  killed), and a progress stream on an upload in flight polls every 50 ms, so a few hundred streams on one slow
  upload would take the event loop that streams every answer. Without an ``upload_id`` Gradio tracks nothing. The page only loses the progress bar
  of an image's upload (at most ``OWLET_UI_MAX_UPLOAD_BYTES``); the upload itself is unchanged.
- **``/gradio_api/file=`` serves local files only.** Given a URL, Gradio fetches it and streams it back, with no
  read timeout and no size limit: an open proxy on the host's bandwidth. The page only ever names files in its
  upload cache.
"""
from __future__ import annotations

from urllib.parse import parse_qsl, urlencode

from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from ui.shared.route_paths import API_PATHS, API_PREFIX, FILE_PREFIXES, MODELS_PATH, UPLOAD_PATH

OPEN_PATHS = frozenset({
    "/", "/config", "/config/", "/favicon.ico", "/theme.css", "/manifest.json", "/robots.txt",
    "/login", "/login/", "/logout", "/healthz", "/metrics",
    "/gradio_api/info", "/gradio_api/info/", "/gradio_api/theme.css", "/gradio_api/startup-events",
    "/gradio_api/app_id", "/gradio_api/app_id/", "/gradio_api/user", "/gradio_api/user/",
    "/gradio_api/login_check", "/gradio_api/login_check/",
    "/gradio_api/queue/join", "/gradio_api/queue/data", "/gradio_api/queue/status",
    "/gradio_api/upload", "/gradio_api/cancel", "/gradio_api/reset",
    "/gradio_api/reset/",
})
OPEN_PREFIXES = ("/assets/", "/static/", "/svelte/", "/pwa_icon", "/gradio_api/file=", "/gradio_api/file/",
                 "/gradio_api/heartbeat/", "/gradio_api/call/", "/gradio_api/run/", "/gradio_api/api/")



def is_open(path: str) -> bool:
    if path.startswith(FILE_PREFIXES) and _names_a_url(path.split("file", 1)[1][1:]):
        return False
    if path.startswith(API_PREFIX):
        return path in API_PATHS or _names_a_model(path)
    return path in OPEN_PATHS or path.startswith(OPEN_PREFIXES)


def _names_a_model(path: str) -> bool:
    """``/v1/models/<name>``: one model's description."""
    name = path[len(MODELS_PATH) + 1:] if path.startswith(MODELS_PATH + "/") else ""
    return bool(name) and "/" not in name


def _names_a_url(target: str) -> bool:
    """Whether a served-file target is a URL (Gradio would fetch it) rather than a local path."""
    target = target.strip().lower()
    return "://" in target or target.startswith(("http:", "https:", "//"))


def without_upload_id(query_string: bytes) -> bytes:
    """The query string minus ``upload_id``: an upload Gradio does not track (see the module notes)."""
    pairs = parse_qsl(query_string.decode("latin-1"), keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if k != "upload_id"]
    return query_string if len(kept) == len(pairs) else urlencode(kept).encode("latin-1")


class PublicRoutes:
    """ASGI middleware: a request for a route outside the allow-list gets 404 before any of Gradio's code runs
    (websockets are closed)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        if is_open(path):
            if path == UPLOAD_PATH and scope.get("query_string"):
                scope = {**scope, "query_string": without_upload_id(scope["query_string"])}
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        await PlainTextResponse("Not found.", status_code=404)(scope, receive, send)
