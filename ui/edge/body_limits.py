"""Refuse request bodies larger than any request the page makes, before they are read into memory.

Gradio reads a JSON request body whole and parses it on the event loop that streams everyone's answers
(``/gradio_api/queue/join``, the API's ``/call`` routes, ``/run/predict``); only uploads have a limit of their
own (``max_file_size``, per file). Without a cap, one client sending a few hundred megabytes of JSON would hold
that memory and stall every stream on the page while it is parsed. No request the page or an API client
legitimately sends comes close: a question is at most ``max_text_chars`` characters and images travel through
``/upload``. A declared ``Content-Length`` over the limit is refused at once with 413, unread; a chunked body
is counted as it arrives and refused as soon as it passes the limit (Starlette's ``RequestBodyLimitMiddleware``
does the counting and the 413). The OpenAI-compatible API's chat completions carry their pictures in the body, as
base64: they have a limit of their own (``api_max_request_bytes``), and the API reads them a few at a time
(``ui.api.bodies``).
"""
from __future__ import annotations

from starlette.middleware.body_limit import RequestBodyLimitMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from ui.shared.route_paths import CHAT_COMPLETIONS_PATH, UPLOAD_PATH

# Multipart framing and the form's other fields around an upload of at most ``max_upload_bytes``.
UPLOAD_FRAMING_BYTES = 1024 * 1024


def upload_request_limit(max_upload_bytes: int) -> int:
    """The largest upload request body accepted: one file of the upload limit and its multipart framing."""
    return max_upload_bytes + UPLOAD_FRAMING_BYTES


class PageBodyLimits:
    """``max_body_bytes`` for every request except uploads, which get ``upload_request_limit``, and the API's chat
    completions, which get ``max_api_bytes``."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, max_upload_bytes: int, max_api_bytes: int) -> None:
        self.requests = RequestBodyLimitMiddleware(app, max_body_bytes)
        self.uploads = RequestBodyLimitMiddleware(app, upload_request_limit(max_upload_bytes))
        self.completions = RequestBodyLimitMiddleware(app, max_api_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # Only the upload route itself: "/gradio_api/run/upload" is a JSON call that would get an upload's limit.
        path = scope["path"] if scope["type"] == "http" else ""
        limited = {UPLOAD_PATH: self.uploads, CHAT_COMPLETIONS_PATH: self.completions}.get(path, self.requests)
        await limited(scope, receive, send)
