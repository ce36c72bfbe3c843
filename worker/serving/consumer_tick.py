"""Keep a busy worker listening: a short tick on Celery's event loop, so a freed thread takes the next job at once.

With prefetch disabled (``worker.celery_app``), Celery's Redis consumer asks for a message only while a thread of
its pool is free. When every thread holds a job it stops asking, and it looks again only on its event loop's next
tick. Nothing wakes that loop when a job's thread returns, so the loop sleeps out its poll timeout: up to a second
with no timers due. A job dispatched into the freed slot then waited that long before any thread took it, every
time a worker's threads had all been busy: in ``bench.abuse`` (4 decode rows, 6 threads) honest users waited
12 service times behind a flood, and every flood job waited as long.

This bootstep puts a repeating no-op timer on the event loop, so it ticks every ``TICK_S`` and a freed thread is
seen within that time. It costs one loop iteration per tick (tens of microseconds). It uses Celery's public
bootstep API (``app.steps["worker"]``) and the loop's documented ``call_repeatedly``.
"""
from __future__ import annotations

from celery import bootsteps

# How soon a thread freed while every thread was busy takes the next job. Small against a job's service time
# (tens of milliseconds on a GPU), large against one loop iteration.
TICK_S = 0.005


def _tick() -> None:
    """Nothing to do: waking the loop is the point (its next iteration asks Redis for a message again)."""


class ConsumerTick(bootsteps.StartStopStep):
    """Ticks the worker's event loop every ``TICK_S`` while the worker runs (no-op without an event loop)."""

    requires = {"celery.worker.components:Hub"}

    def __init__(self, parent, **kwargs):
        super().__init__(parent, **kwargs)
        self._timer = None

    def start(self, parent) -> None:
        hub = getattr(parent, "hub", None)
        if hub is not None:
            self._timer = hub.call_repeatedly(TICK_S, _tick)

    def stop(self, parent) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
