"""The OpenAI error object, ``{"error": {"message", "type", "param", "code"}}``: what the API (``ui.api.errors``)
and the edge (``ui.edge.api_refusals``) answer an API client's refused request with."""
from __future__ import annotations

import json

# The "type" of an OpenAI error object, by status.
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "invalid_request_error", 429: "rate_limit_error", 500: "server_error",
               503: "service_unavailable"}


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """``{"error": {"message", "type", "param", "code"}}``, as OpenAI's API answers an error."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error" if status >= 500
                                                                 else "invalid_request_error"),
                      "param": param, "code": code}}


def is_error_body(raw: bytes) -> bool:
    """Whether a response body is already an OpenAI error object."""
    try:
        parsed = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return False
    return isinstance(parsed, dict) and isinstance(parsed.get("error"), dict)
