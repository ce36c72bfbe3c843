"""At most a few log lines a minute for refusals a stranger can trigger at network speed.

A line (or a traceback, or the whole refused input: 90 KB with the caller's identity token in it) for each refused
request would let one connection write 60 MB of log a second. A ``LogBudget`` lets ``per_minute`` lines through in
each minute, then counts, and says how many it held back with the next line it lets through. A line's text is cut
to ``MAX_LINE_CHARS`` and never includes a request's inputs.
"""
from __future__ import annotations

import logging
import threading
import time

MAX_LINE_CHARS = 200


def first_line(exc: BaseException) -> str:
    """An exception's message without what follows its first line (Gradio appends the received inputs there)."""
    return str(exc).split("\n", 1)[0][:MAX_LINE_CHARS]


class _MinuteBudget:
    """``per_minute`` lines in each minute; counts the ones held back since the last line let through."""

    def __init__(self, per_minute: int, clock):
        self.per_minute, self._clock = per_minute, clock
        self._window_start, self._used, self._held_back = clock(), 0, 0
        self._lock = threading.Lock()

    def take(self) -> int | None:
        """None if this line must be held back; else how many were held back before it."""
        with self._lock:
            now = self._clock()
            if now - self._window_start >= 60:
                self._window_start, self._used = now, 0
            if self._used >= self.per_minute:
                self._held_back += 1
                return None
            self._used += 1
            held_back, self._held_back = self._held_back, 0
            return held_back


def _with_count(text: str, held_back: int) -> str:
    return text + (f" ({held_back} more like it were not logged)" if held_back else "")


class LogBudget:
    def __init__(self, logger: logging.Logger, per_minute: int = 20, clock=time.monotonic):
        self.logger = logger
        self._budget = _MinuteBudget(per_minute, clock)

    def warning(self, message: str, *args) -> bool:
        """Log ``message % args`` (cut to MAX_LINE_CHARS) if the minute's budget allows; True if logged."""
        return self._log(logging.WARNING, message, args)

    def error(self, message: str, *args) -> bool:
        """``warning``, as an error: what the operator must fix (a full disk), said as often as the budget allows."""
        return self._log(logging.ERROR, message, args)

    def _log(self, level: int, message: str, args: tuple) -> bool:
        held_back = self._budget.take()
        if held_back is None:
            return False
        self.logger.log(level, _with_count((message % args if args else message)[:MAX_LINE_CHARS], held_back))
        return True


# Libraries under the page that log a warning for each malformed request a stranger sends: uvicorn ("Invalid HTTP
# request received.", a bad Host header: 41 B a request) and python-multipart (a broken upload body: 110 B).
NOISY_LIBRARY_LOGGERS = ("uvicorn.error", "python_multipart.multipart")


class BudgetedWarnings(logging.Filter):
    """A logger filter: its warnings go through a minute's budget; errors and anything more severe always pass."""

    def __init__(self, per_minute: int = 20, clock=time.monotonic):
        super().__init__()
        self._budget = _MinuteBudget(per_minute, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING:
            return True
        held_back = self._budget.take()
        if held_back is None:
            return False
        if held_back:
            record.msg, record.args = _with_count(record.getMessage(), held_back), None
        return True


def budget_library_warnings(loggers=NOISY_LIBRARY_LOGGERS) -> None:
    """Put each of ``loggers``' warnings through a budget of its own (once per logger)."""
    for name in loggers:
        logger = logging.getLogger(name)
        if not any(isinstance(f, BudgetedWarnings) for f in logger.filters):
            logger.addFilter(BudgetedWarnings())
