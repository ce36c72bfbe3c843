"""What a refused or failed turn tells its user, and how it is counted.

A refusal (an exception carrying ``user_message``: ``worker.errors.OwletError``, ``SlotRefused``,
``IdentityRequired``) is shown as its own sentence and counted under the ``metric_kind`` its class declares; one
for a limit (an HTTP status of 429 or 503) is also noted against the caller's address under its API code
(``ui.edge.refusal_brake``). Anything
else is a failure: logged, counted as ``service_down``, and shown as the service being unavailable.
"""
from __future__ import annotations

import logging

from ui.edge.refusal_brake import REFUSED_STATUSES, RefusalLedger
from ui.shared import wording

log = logging.getLogger("owlet.ui")


class TurnErrors:
    def __init__(self, metrics, refusals: RefusalLedger):
        self.metrics, self.refusals = metrics, refusals

    def sentence(self, exc: Exception, address: str | None = None) -> str:
        """The sentence for what refused or failed a turn; a refusal for a limit is noted against ``address``."""
        message = getattr(exc, "user_message", None)
        if message:
            self.metrics.errors.labels(getattr(exc, "metric_kind", None) or "other").inc()
            self.metrics.turns.labels("refused").inc()
            status = getattr(exc, "http_status", None)  # as the API answers it (ui.api.errors.from_exception)
            if address is not None and status in REFUSED_STATUSES:
                self.refusals.note(address, exc.api_code)
            return message
        log.exception("turn failed", exc_info=exc)
        self.metrics.errors.labels("service_down").inc()
        self.metrics.turns.labels("error").inc()
        return wording.SERVICE_DOWN
