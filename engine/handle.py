"""RequestHandle: the caller's end of a request — a stream of text deltas, then one FinalResult.

The engine thread pushes; any number of caller threads may wait. Nothing here touches the model.
"""
from __future__ import annotations

import queue
import threading

from .outputs import FinalResult

_END = object()


class RequestHandle:
    def __init__(self, request_id: str):
        self.request_id = request_id
        self._deltas: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self._result: FinalResult | None = None

    # engine side -------------------------------------------------------------
    def push_delta(self, text: str) -> None:
        if text:
            self._deltas.put(text)

    def finish(self, result: FinalResult) -> None:
        assert self._result is None, f"request {self.request_id} finished twice"
        self._result = result
        self._done.set()
        self._deltas.put(_END)

    # caller side -------------------------------------------------------------
    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def __iter__(self):
        """Yield text deltas until the request finishes. Ends on its own: every request has a deadline."""
        while True:
            item = self._deltas.get()
            if item is _END:
                return
            yield item

    def take(self) -> tuple[list[str], bool]:
        """Wait for at least one delta (or the end), then take every delta already pushed, without waiting.

        Returns ``(deltas, ended)``. A caller that publishes deltas (the worker) calls this once per interval,
        so tokens that arrived together cross in one write instead of one wake-up and one write each.
        """
        items = [self._deltas.get()]
        while True:
            try:
                items.append(self._deltas.get_nowait())
            except queue.Empty:
                break
        ended = items[-1] is _END  # nothing is pushed after the end marker
        return [item for item in items if item is not _END], ended

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, or less if the request finishes meanwhile; True if it finished."""
        return self._done.wait(timeout)

    def result(self, timeout: float | None = None) -> FinalResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} still running after {timeout}s")
        return self._result
