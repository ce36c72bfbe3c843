"""The edge's refusals in one shape: a sentence, a status, ``Retry-After``, and the code of the limit that refused.

Each middleware that refuses a request for a limit answers with ``refusal(...)``, which also leaves the code in the
request's scope. Outer layers read it there: the API's error objects take it as their ``code``
(``ui.edge.api_refusals``), so each limit has its own code with its own ``Retry-After`` meaning, and the refusal brake
(``ui.edge.refusal_brake``) counts it against the address.

Codes and what their ``Retry-After`` means:

- ``too_many_open_requests``: the address holds as many open requests of one kind as it may (answer streams, bodies
  arriving, tabs' heartbeats, downloads). It frees when one of them ends, which nobody can foretell: ``Retry-After``
  is a short interval to try again in.
- ``too_many_new_tabs``, ``too_many_logins``: a count per sliding window; ``Retry-After`` is when the oldest leaves it.
- ``upload_budget``: upload bytes per window; ``Retry-After`` is when enough of them leave it.
- ``uploads_arriving``: uploads arriving at once; a short interval, as for open requests.
- ``too_many_unread_events``: a tab's events whose results nobody read yet; read them first.
- ``refusals_limited``: the address kept asking after refusals without waiting (``ui.edge.refusal_brake``);
  ``Retry-After`` is when it may ask again.
- ``storage_full``: the disk the page keeps uploads on is full (status 503, the operator's to fix; the page logs it);
  ``Retry-After`` is a minute.
"""
from __future__ import annotations

import math

from starlette.responses import PlainTextResponse
from starlette.types import Scope

REFUSAL_CODE = "owlet.refusal_code"  # where in a request's scope the code of the limit that refused it is left
OPEN_REQUEST_RETRY_S = 5  # a cap of requests at once frees when one ends: try again in a few seconds

TOO_MANY_OPEN_REQUESTS = "too_many_open_requests"
TOO_MANY_NEW_TABS = "too_many_new_tabs"
TOO_MANY_LOGINS = "too_many_logins"
UPLOAD_BUDGET = "upload_budget"
UPLOADS_ARRIVING = "uploads_arriving"
TOO_MANY_UNREAD_EVENTS = "too_many_unread_events"
REFUSALS_LIMITED = "refusals_limited"
STORAGE_FULL = "storage_full"


def refusal(scope: Scope, code: str, sentence: str, status: int = 429,
            retry_after_s: float | None = None) -> PlainTextResponse:
    """The response refusing a request for the limit ``code``, noted in ``scope``."""
    scope[REFUSAL_CODE] = code
    headers = {"Retry-After": str(max(1, math.ceil(retry_after_s)))} if retry_after_s is not None else None
    return PlainTextResponse(sentence, status_code=status, headers=headers)


def code_of(scope: Scope) -> str | None:
    """The code of the limit that refused this request at the edge, if one did."""
    return scope.get(REFUSAL_CODE)
