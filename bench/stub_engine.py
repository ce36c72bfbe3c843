"""A model-free engine for measuring the page alone: it "generates" tokens at a fixed rate.

The real Celery worker loads it through ``OWLET_ENGINE_FACTORY=bench.stub_engine:from_env``, so the job's
events (queued, started, token, done) reach the job's Redis Stream by the real path (submit and claim
scripts, the runner's coalesced token writes (``worker.serving.deltas``), the finish script), at almost no CPU cost in
the worker beyond the real path's own.

Each token's text is the wall-clock millisecond it was due, followed by a space (``"1764464405123 "``), so
a client that sees the token can tell how long it took to reach it (the worker's pick-up and coalescing
included), with no side channel. Answers are
``max_new_tokens`` long; ``OWLET_STUB_TOKENS_PER_S`` sets the rate per answer (default 40).
"""
from __future__ import annotations

import os
import threading
import time

from engine.outputs import FinalResult, FinishReason, RequestStats


class StubHandle:
    """What the worker uses of an engine handle (``take``, ``wait``, ``result``), for a schedule of tokens.

    Token i is due ``i / tokens_per_s`` after the request arrived, and its text is the wall-clock millisecond
    it was due: a worker thread that picks it up late makes that lateness visible as latency downstream.
    """

    def __init__(self, request_id: str, n_tokens: int, tokens_per_s: float, deadline_s: float | None):
        self.request_id, self.n_tokens, self.interval = request_id, n_tokens, 1.0 / tokens_per_s
        self.deadline = time.monotonic() + deadline_s if deadline_s else None
        self.aborted = threading.Event()
        self._text: list[str] = []
        self._reason = FinishReason.LENGTH
        self._started = time.monotonic()
        self._wall_start = time.time()
        self._first: float | None = None

    def _ended(self) -> bool:
        if self.aborted.is_set():
            self._reason = FinishReason.CANCELLED
            return True
        if self.deadline is not None and time.monotonic() > self.deadline:
            self._reason = FinishReason.DEADLINE
            return True
        return len(self._text) >= self.n_tokens

    def take(self) -> tuple[list[str], bool]:
        """Wait for the next due token (or the end), then return every token due by now."""
        while not self._ended():
            due = min(self.n_tokens, int((time.monotonic() - self._started) / self.interval) + 1)
            if due > len(self._text):
                fresh = [f"{int((self._wall_start + i * self.interval) * 1000)} " for i in range(len(self._text), due)]
                if self._first is None:
                    self._first = time.monotonic() - self._started
                self._text.extend(fresh)
                return fresh, self._ended()
            self.aborted.wait(self._started + due * self.interval - time.monotonic())
        return [], True

    def wait(self, timeout: float) -> bool:
        """Sleep up to ``timeout``, less if aborted or if the answer's last token falls due sooner (as the engine's
        handle wakes at its request's end); True if the answer is over."""
        last_due = self._started + (self.n_tokens - 1) * self.interval
        self.aborted.wait(max(0.0, min(timeout, last_due - time.monotonic())))
        return self._ended()

    def result(self, timeout: float | None = None) -> FinalResult:
        n = len(self._text)
        decode_s = max(1e-9, time.monotonic() - self._started - (self._first or 0.0))
        stats = RequestStats(prompt_tokens=8, generated_tokens=n, ttft_s=self._first,
                             decode_tokens_per_s=(n - 1) / decode_s if n > 1 else None)
        return FinalResult(self.request_id, "".join(self._text), list(range(n)), self._reason, stats)


class StubEngine:
    """The engine surface the worker runtime uses: add_request, abort, stats, start, stop."""

    def __init__(self, tokens_per_s: float, max_running: int):
        assert tokens_per_s > 0 and max_running >= 1, "need a positive rate and at least one slot"
        self.tokens_per_s, self.max_running = tokens_per_s, max_running
        self._live: dict[str, StubHandle] = {}
        self._lock = threading.Lock()

    def add_request(self, messages, sampling, *, session_id=None, request_id=None, deadline_s=None,
                    group=None) -> StubHandle:
        handle = StubHandle(request_id or "stub", sampling.max_new_tokens, self.tokens_per_s, deadline_s)
        with self._lock:
            self._live[handle.request_id] = handle
        return _Forget(handle, self)

    def abort(self, request_id: str) -> bool:
        with self._lock:
            handle = self._live.get(request_id)
        if handle is not None:
            handle.aborted.set()
        return handle is not None

    def done(self, request_id: str) -> None:
        with self._lock:
            self._live.pop(request_id, None)

    def stats(self) -> dict:
        with self._lock:
            running = len(self._live)
        return {"max_running": self.max_running, "running": running, "waiting": 0, "sessions": []}

    def start(self) -> "StubEngine":
        return self

    def stop(self, timeout: float = 10.0) -> None:
        with self._lock:
            handles = list(self._live.values())
        for handle in handles:
            handle.aborted.set()


class _Forget:
    """Wraps a handle so the engine forgets it once its result is taken (its slot is free again)."""

    def __init__(self, handle: StubHandle, engine: StubEngine):
        self._handle, self._engine = handle, engine

    def take(self) -> tuple[list[str], bool]:
        return self._handle.take()

    def wait(self, timeout: float) -> bool:
        return self._handle.wait(timeout)

    def result(self, timeout: float | None = None) -> FinalResult:
        try:
            return self._handle.result(timeout)
        finally:
            self._engine.done(self._handle.request_id)


def from_env() -> StubEngine:
    return StubEngine(float(os.environ.get("OWLET_STUB_TOKENS_PER_S", "40")),
                      int(os.environ.get("OWLET_MAX_RUNNING", "64")))
