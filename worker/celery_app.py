"""Celery app factory. The worker's engine is created in a start-up signal, never at import.

- threads pool: one process, one engine, many jobs sharing its batch;
- prefetch disabled: a worker takes a job only when a thread is free, so waiting jobs stay in Redis
  where the fair dispatcher sees them; a short event-loop tick (``worker.serving.consumer_tick``) makes a freed
  thread take the next job at once, and a thread whose job ended takes the next one itself, from the fair queue, without
  Celery (``WorkerRuntime.run_job``, ``OWLET_WORKER_TAKES_NEXT``);
- worker_direct: each worker also consumes its own queue ``<node>.dq2`` for conversation affinity;
- acks on receipt and no result backend: failover is ours (heartbeats + re-dispatch), results go to streams; so
  kombu's ack emulation is off too (it recorded every message it delivered, and deleted the record on the ack: two
  round trips a message, to restore what Owlet's reaper re-dispatches anyway, as a job dispatched and never claimed);
- fail loudly: a worker whose engine cannot start exits non-zero with the reason (``worker.serving.startup``).
"""
from __future__ import annotations

from celery import Celery, signals

from owlet.setting_names import warn_unread
from owlet.settings import SettingError
from worker.config import Settings
from worker.queue.scripts import RedisCannotRunQueue
from worker.serving.consumer_tick import ConsumerTick


def create_app(settings: Settings | None = None, with_runtime: bool = False) -> Celery:
    """Build the Celery app. ``with_runtime`` wires the worker start-up/shutdown signals (worker side only)."""
    settings = settings or Settings.from_env()
    app = Celery("owlet", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        broker_transport_options={"global_keyprefix": settings.key_prefix + "celery:", "ack_emulation": False},
        broker_connection_retry_on_startup=True,
        task_default_queue=settings.key_prefix + "jobs",
        task_ignore_result=True,
        task_acks_late=False,
        worker_direct=True,
        worker_prefetch_multiplier=1,
        worker_disable_prefetch=True,
        worker_pool="threads",
        worker_hijack_root_logger=False,
        worker_send_task_events=False,
        worker_enable_remote_control=False,
    )
    app.owlet_settings = settings
    if with_runtime:
        from worker.tasks import register_tasks

        # a thread for every answer the engine holds (decode rows and paused answers) plus a little slack; the
        # dispatcher, not Celery, limits load
        from engine.config import max_active_from_env

        app.conf.worker_concurrency = settings.worker_concurrency or max_active_from_env() + 2

        register_tasks(app)
        app.steps["worker"].add(ConsumerTick)
        _wire_runtime(app, settings)
    return app


def _wire_runtime(app: Celery, settings: Settings) -> None:
    from worker.serving import startup

    def configure_logging(**_):
        startup.configure_logging()  # before worker_init: Celery sets up its own logging only after it

    def start(sender=None, **_):
        if getattr(sender, "app", None) is not app:
            return
        # Anything that goes wrong here must end the process: Celery would log a handler's exception and
        # carry on as a worker with no engine that looks healthy and never serves a job.
        try:
            warn_unread(startup.log)  # a misspelt or renamed OWLET_* variable would otherwise pass unnoticed
            if not settings.engine_factory:
                startup.check_engine_environment()  # before the heavy imports: the common mistakes fail fast
            from worker.serving.runtime import WorkerRuntime

            app.owlet_runtime = WorkerRuntime(settings, app, sender.hostname, threads=sender.concurrency)
            app.owlet_runtime.start()
        except (startup.CannotServe, SettingError, RedisCannotRunQueue) as exc:
            startup.fail(str(exc))
        except Exception as exc:  # import errors, a model that does not load, Redis unreachable, ...
            startup.log.exception("engine start-up failed")
            startup.fail(f"{type(exc).__name__}: {exc}")

    def stop(sender=None, **_):
        runtime = getattr(app, "owlet_runtime", None)
        if runtime is not None:
            runtime.stop()

    def stop_taking(sender=None, **_):
        # a warm shutdown waits for the task threads: one that kept taking jobs itself would never return
        runtime = getattr(app, "owlet_runtime", None)
        if runtime is not None:
            runtime.stop_taking()

    signals.celeryd_init.connect(configure_logging, weak=False)
    signals.worker_init.connect(start, weak=False)
    signals.worker_shutting_down.connect(stop_taking, weak=False)
    signals.worker_shutdown.connect(stop, weak=False)
