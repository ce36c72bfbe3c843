"""The API's errors: OpenAI-shaped error objects with the right status, built from what refused the request.

Every refusal a client can meet is a sentence it can act on, the same one the page shows: the worker's
(``worker.errors``), the upload checks' (``ui.uploads.image_check``), the per-address slots' and the identity's.
Never a traceback. Each refusal's class declares its ``http_status`` and ``api_code``; ``from_exception`` reads
them:

- 400 bad input, 401 a key that does not verify, 404 an unknown model, 413 a picture or body too large;
- 429 with ``Retry-After`` for per-identity and per-address caps, rate limits and quotas, each with its own code:
  ``turn_rate_limited`` (the address's turns per window; ``Retry-After`` is when the window admits one more),
  ``address_cap`` (its questions waiting or answered; a short interval), the edge's ``too_many_open_requests``
  (``ui.shared.refusals``), and so on;
- 503, with ``Retry-After`` too, when the service is busy as a whole, or its queue (Redis) is unreachable.
"""
from __future__ import annotations

import math

from starlette.responses import JSONResponse

from ui.shared import wording
from ui.shared.openai_errors import error_body

CAP_RETRY_S = 5  # a cap frees up when one of the client's answers ends, a busy service soon: ask again in seconds

# The kinds of a worker's error event (worker.serving.runner) that say the question itself was refused.
BAD_QUESTION_KINDS = frozenset({"invalid", "InvalidInput", "ImageMissing", "NotYourConversation"})


class ApiError(Exception):
    """A refused API request: its status, sentence, OpenAI ``code`` and, for 429 and 503, seconds to wait."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 retry_after_s: float | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param
        self.retry_after_s = retry_after_s

    def body(self) -> dict:
        return error_body(self.status, self.message, self.code, self.param)

    def response(self) -> JSONResponse:
        headers = {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(max(1, math.ceil(self.retry_after_s)))
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


def from_exception(exc: BaseException) -> ApiError:
    """The API error for what refused a request: a worker refusal, an upload check, a per-address slot, an
    unreachable queue. Anything else is a server error with a plain sentence (the caller logs it)."""
    if isinstance(exc, ApiError):
        return exc
    status = getattr(exc, "http_status", None)
    if status is not None:  # a refusal that declares its own status and code (worker.errors.OwletError and kin)
        message = getattr(exc, "api_message", None) or getattr(exc, "user_message", None) or wording.SERVICE_DOWN
        retry = getattr(exc, "retry_after_s", None)
        if status in (429, 503) and retry is None:
            retry = CAP_RETRY_S
        return ApiError(status, message, exc.api_code, retry_after_s=retry)
    if type(exc).__name__ == "ClientDisconnect":  # starlette: the client left while its body arrived; nobody reads
        return ApiError(499, "The client closed the request.", "client_closed_request")
    if _unreachable(exc):
        return ApiError(503, wording.SERVICE_DOWN, "queue_unreachable", retry_after_s=CAP_RETRY_S)
    return ApiError(500, "Owlet hit an internal error. Please try again.", "internal_error")


def for_failed_answer(kind: str | None, message: str) -> ApiError:
    """The API error for an answer that ended in error (a worker's error event, or a stream given up on)."""
    if kind in BAD_QUESTION_KINDS:
        return ApiError(400, message, "invalid_input")
    if kind is None:  # lost workers, queue timeouts: the service could not answer now
        return ApiError(503, message, "not_answered", retry_after_s=CAP_RETRY_S)
    return ApiError(500, message, "answer_failed")


def _unreachable(exc: BaseException) -> bool:
    """A Redis connection or timeout error (by module, so the page need not import redis here)."""
    return any(cls.__module__.startswith("redis") for cls in type(exc).__mro__) or isinstance(exc, ConnectionError)
