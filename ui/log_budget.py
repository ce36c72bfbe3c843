"""At most a few log lines a minute for refusals a stranger can trigger at network speed.

Each refused request used to write a line (or a traceback, or the whole refused input: 90 KB with the caller's
identity token in it), so one connection could write 60 MB of log a second (a hostile audit, 2026-12-03). A
``LogBudget`` lets ``per_minute`` lines through in each minute, then counts, and says how many it held back
with the next line it lets through. A line's text is cut to ``MAX_LINE_CHARS`` and never includes a request's
inputs.
"""
from __future__ import annotations

import logging
import threading
import time

MAX_LINE_CHARS = 200


def first_line(exc: BaseException) -> str:
    """An exception's message without what follows its first line (Gradio appends the received inputs there)."""
    return str(exc).split("\n", 1)[0][:MAX_LINE_CHARS]


class LogBudget:
    def __init__(self, logger: logging.Logger, per_minute: int = 20, clock=time.monotonic):
        self.logger, self.per_minute, self._clock = logger, per_minute, clock
        self._window_start, self._used, self._held_back = clock(), 0, 0
        self._lock = threading.Lock()

    def warning(self, message: str, *args) -> bool:
        """Log ``message % args`` (cut to MAX_LINE_CHARS) if the minute's budget allows; True if logged."""
        with self._lock:
            now = self._clock()
            if now - self._window_start >= 60:
                self._window_start, self._used = now, 0
            if self._used >= self.per_minute:
                self._held_back += 1
                return False
            self._used += 1
            held_back, self._held_back = self._held_back, 0
        text = (message % args if args else message)[:MAX_LINE_CHARS]
        if held_back:
            text += f" ({held_back} more like it were not logged)"
        self.logger.warning(text)
        return True
