"""The worker's event loop ticks every few milliseconds, so a job dispatched into a freed thread is taken at once.

What it fixes is measured by ``bench.abuse`` (a worker whose threads were all busy took the next job only at its
event loop's next wake-up, up to a second later); here: the step is part of every worker, and it keeps a repeating
timer on the loop while the worker runs."""
from __future__ import annotations

from types import SimpleNamespace

from kombu.asynchronous import Hub

from worker.celery_app import create_app
from worker.config import Settings
from worker.serving.consumer_tick import TICK_S, ConsumerTick


def test_every_worker_app_ticks_its_event_loop():
    app = create_app(Settings(), with_runtime=True)
    assert ConsumerTick in app.steps["worker"]
    assert ConsumerTick not in create_app(Settings()).steps["worker"], "a client app starts no worker steps"


def test_the_tick_is_a_repeating_timer_on_the_loop_until_the_worker_stops():
    hub = Hub()
    worker = SimpleNamespace(hub=hub)
    step = ConsumerTick(worker)
    step.start(worker)
    assert len(hub.timer.queue) == 1
    assert 0 < hub.fire_timers(min_delay=1, max_delay=10) <= TICK_S, "the loop sleeps at most one tick"
    assert 0 < hub.fire_timers(min_delay=1, max_delay=10) <= TICK_S, "and again: the timer repeats"
    timer = step._timer
    step.stop(worker)
    assert timer.canceled and step._timer is None
    step.start(SimpleNamespace(hub=None))  # a worker without an event loop (e.g. solo pool): nothing to tick
