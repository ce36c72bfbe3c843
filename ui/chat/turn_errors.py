"""What a refused or failed turn tells its user, and how it is counted.

A refusal (an exception carrying ``user_message``: ``worker.errors.OwletError``, ``SlotRefused``,
``IdentityRequired``) is shown as its own sentence and counted under the ``metric_kind`` its class declares; one
for a limit is also noted against the caller's address under its API code (``ui.edge.refusal_brake``). Anything
else is a failure: logged, counted as ``service_down``, and shown as the service being unavailable.
"""
from __future__ import annotations

import logging

from ui.api.errors import from_exception
from ui.chat import wording
from ui.edge.refusal_brake import REFUSED_STATUSES, RefusalLedger

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
            refused = from_exception(exc)
            if address is not None and refused.status in REFUSED_STATUSES:
                self.refusals.note(address, refused.code)
            return message
        log.exception("turn failed", exc_info=exc)
        self.metrics.errors.labels("service_down").inc()
        self.metrics.turns.labels("error").inc()
        return wording.SERVICE_DOWN
