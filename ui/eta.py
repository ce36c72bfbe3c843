""""About N s" for a queued job: position × mean answer time ÷ the cluster's free-running capacity.

The queue does not know how long answers take, so the page learns it: an exponentially weighted mean of
the run time (start to last token) of the answers this process has streamed, starting from a prior.
Capacity is the sum of live workers' batch slots from their heartbeats. The estimate is deliberately
simple: it tells a user whether to wait seconds or minutes, not a promise.
"""
from __future__ import annotations

import threading


class EtaEstimator:
    def __init__(self, client, prior_run_s: float = 8.0, weight: float = 0.2):
        assert prior_run_s > 0 and 0 < weight <= 1, "prior must be positive and weight in (0, 1]"
        self.client, self.weight = client, weight
        self._mean_run_s = prior_run_s
        self._lock = threading.Lock()

    def observe(self, run_s: float) -> None:
        """Record one finished answer's run time."""
        if run_s > 0:
            with self._lock:
                self._mean_run_s += self.weight * (run_s - self._mean_run_s)

    @property
    def mean_run_s(self) -> float:
        return self._mean_run_s

    def eta_s(self, position: int | None) -> float | None:
        """Seconds until a job at ``position`` should start; None when unknown (no position, no workers)."""
        if not position:
            return None
        try:
            workers = self.client.health().get("workers", [])
        except Exception:
            return None
        capacity = sum(max(1, int(w.get("capacity", 1))) for w in workers)
        if capacity == 0:
            return None
        return position * self._mean_run_s / capacity
