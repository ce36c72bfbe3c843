"""Everything one worker process owns: its engine, Redis clients, heartbeat and cancel-watch threads.

Created in Celery's worker_init signal (``worker.celery_app``), so importing the worker loads nothing.
The heartbeat thread also runs the reaper sweep and a dispatch pass on every tick, which keeps the
service work-conserving even when no UI process is submitting.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import threading
from pathlib import Path

import redis

from owlet.allocator import start_trimming
from worker import heartbeat
from worker.config import Settings
from worker.history import ConversationStore
from worker.images import ImageStore
from worker.keys import Keys
from worker.queue.dispatch import FairDispatch
from worker.queue.job_states import JobStates, Started, Taken
from worker.queue.prefix_routes import HeldRoutes
from worker.queue.readouts import QueueReadouts
from worker.queue.reaper import Reaper
from worker.serving.metrics import WorkerMetrics
from worker.serving.runner import JobRunner

log = logging.getLogger(__name__)

# the error of a job put back in line this way once its attempts are spent (REQUEUE)
LOST_REPLY = "The chat service lost your question while starting it, and a retry failed too. Please try again."


def build_engine(settings: Settings):
    """``engine.LLMEngine`` configured from the environment (``EngineConfig.from_env``), or the engine named by
    ``OWLET_ENGINE_FACTORY`` ("module:callable"; the page benchmark's model-free stub)."""
    if settings.engine_factory:
        module, _, name = settings.engine_factory.partition(":")
        return getattr(importlib.import_module(module), name)()
    from engine import EngineConfig, LLMEngine

    return LLMEngine(EngineConfig.from_env())


def model_name(engine) -> str:
    """The checkpoint an engine serves, by its folder's name ("" for an engine without one, e.g. the stub)."""
    model = getattr(getattr(engine, "config", None), "model", "")
    return Path(model).name if isinstance(model, str) and model else ""


def _engine_slots(stats: dict) -> int:
    """Answers the engine holds at once: rows and paused answers (an engine without time slicing reports only
    ``max_running``, e.g. the page benchmark's stub)."""
    return int(stats.get("max_active", stats.get("max_running", 1)))


class WorkerRuntime:
    def __init__(self, settings: Settings, celery_app, worker: str, engine=None, threads: int | None = None):
        self.settings, self.worker = settings, worker
        # Each job holds one of Celery's threads while it streams, so the worker takes no more jobs at once than it
        # has threads, whatever the engine could batch: jobs dispatched beyond that sat unclaimed until the reaper
        # took them for a dead worker's. None: as many as the engine (an in-process runtime).
        self.threads = threads
        self.keys = Keys(settings.key_prefix)
        self.r = redis.Redis.from_url(settings.redis_url)
        self.readouts = QueueReadouts(self.r, self.keys)
        self.jobs = JobStates(self.r, self.keys, settings)
        self.fair = FairDispatch(self.r, self.keys, self.jobs, celery_app)
        self.reaper = Reaper(self.r, self.keys, settings, self.jobs)
        self.images = ImageStore(self.r, self.keys, settings.image_ttl_s, settings.image_max_bytes)
        self.convs = ConversationStore(self.r, self.keys, settings.history_ttl_s)
        self.metrics = WorkerMetrics(worker)
        self.engine = engine if engine is not None else build_engine(settings)
        self._active: set[str] = set()  # job ids submitted to the engine and not finished
        self.routes = HeldRoutes()  # first questions it ran, announced for prefix routing (worker.queue.prefix_routes)
        # Job ids a thread of this worker holds, from the claim (or take) that started them to their end. A job Redis
        # records as started here that no thread holds was taken by a script whose reply was lost (Redis went away
        # between running it and answering): _sweep_unheld puts it back in line.
        self._held: set[str] = set()
        self._unheld_seen: set[str] = set()
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_dispatch = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server = None
        self.runner = JobRunner(worker=worker, settings=settings, r=self.r, keys=self.keys, jobs=self.jobs,
                                convs=self.convs, images=self.images, slots=self, metrics=self.metrics)
        # The live workers' slots and decode rows in all (the capacity POP checks), read on every heartbeat tick:
        # a worker taking its next job itself (take_next) uses the last reading instead of a round trip per job.
        self._totals = (0, 0)
        self._taking = threading.Event()  # set while this worker takes jobs itself; cleared when shutdown starts
        if settings.worker_takes_next:
            self._taking.set()

    # -- life cycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self.engine.start()
        adopted = self.jobs.adopt_line()  # questions left waiting by an earlier version of the line
        if adopted:
            log.info("owlet worker %s: %d client groups waiting in the line's earlier form put in line", self.worker,
                     adopted)
        if self.settings.worker_metrics_port:  # up before the heartbeat says this worker is
            self._metrics_server = self.metrics.serve(self.settings.worker_metrics_port)
        self._beat()  # announce capacity before the first job can arrive
        for target, name in ((self._heartbeat_loop, "owlet-heartbeat"), (self._cancel_loop, "owlet-cancel")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)
        self._trimmer = start_trimming(self.settings.malloc_trim_s)  # freed heap back to the system (owlet.allocator)
        log.info("owlet worker %s ready (capacity %s)", self.worker, self._capacity())
        engine_slots = _engine_slots(self.engine.stats())
        if self.threads is not None and self.threads < engine_slots:
            log.warning("owlet worker %s: %d Celery threads for an engine that holds %d answers at once: it takes %d "
                        "jobs at once (give it more threads, -c or OWLET_WORKER_CONCURRENCY, to fill the engine)",
                        self.worker, self.threads, engine_slots, self.threads)

    def stop(self) -> None:
        self._taking.clear()
        self._stop.set()
        if getattr(self, "_trimmer", None) is not None:
            self._trimmer.stop.set()
        self._wake_dispatch.set()
        for t in self._threads:
            t.join(timeout=5)
        heartbeat.withdraw(self.r, self.keys, self.worker)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        self.engine.stop()

    # -- jobs ----------------------------------------------------------------------------------------------
    def run_job(self, job_id, dispatch_n) -> None:
        self.runner.run(job_id, dispatch_n)

    def submit_to_engine(self, job_id: str, messages, sampling, conv: str, group: str, prefixes=()):
        with self._lock:
            self._active.add(job_id)
        self.routes.add(prefixes)
        return self.engine.add_request(messages, sampling, session_id=conv, request_id=job_id,
                                       deadline_s=self.settings.job_deadline_s, group=group)

    def hold(self, job_id: str) -> bool:
        """A thread of this worker has started ``job_id`` (claimed or taken) and will end it. False when another thread
        of this worker holds it already: it was put back in line while it ran here (this worker was presumed lost,
        its heartbeat late on an overloaded host) and came back; the thread already answering it ends it."""
        with self._lock:
            if job_id in self._held:
                return False
            self._held.add(job_id)
            return True

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._held.discard(job_id)
            self._active.discard(job_id)
            self._aborted.discard(job_id)

    def dispatch_soon(self) -> None:
        """A slot was freed: let the heartbeat thread dispatch now instead of at its next tick."""
        self._wake_dispatch.set()

    def take_args(self) -> tuple[int, int, str] | None:
        """(capacity, decode rows, this worker) for a finish that takes this worker's next job; None while it takes
        none (shutting down, the setting off, no heartbeat read yet)."""
        capacity, rows = self._totals
        return (capacity, rows, self.worker) if self._taking.is_set() and capacity > 0 else None

    def start_taken(self, taken: Taken) -> tuple[str, Started] | None:
        """A job a finish took for this worker: run it here, or, when another worker holds its conversation, send it
        there and take another (``take_next``)."""
        if taken.started is not None:
            return self._keep(taken)
        try:
            self.fair.send(taken.job, taken.dispatch_n, taken.conv)
        except redis.RedisError as exc:  # still dispatched: the reaper re-queues it after its grace
            log.warning("sending job %s on failed (%s)", taken.job, exc)
            return None
        return self.take_next()

    def take_next(self, tries: int = 4) -> tuple[str, Started] | None:
        """The next job of the fair queue, started on this worker in the slot a job of its own just freed
        (``JobStates.take``), or None: nothing waits, no slot is free, the worker is shutting down, or the setting
        is off. A job whose conversation another worker holds is sent to it (``FairDispatch.send``) and the next
        one tried, ``tries`` in all."""
        capacity, rows = self._totals
        if not self._taking.is_set() or capacity <= 0:
            return None
        for _ in range(tries):
            try:
                taken = self.jobs.take(capacity, rows, self.worker)
                if taken is None:
                    return None
                if taken.started is not None:
                    return self._keep(taken)
                self.fair.send(taken.job, taken.dispatch_n, taken.conv)
            except redis.RedisError as exc:  # the thread returns to Celery; dispatch passes carry on
                log.warning("taking the next job failed (%s)", exc)
                return None
        return None

    def _keep(self, taken: Taken) -> tuple[str, Started] | None:
        """A taken job that started on this worker: a thread of it now holds it (None: another already does)."""
        if not self.hold(taken.job):
            log.warning("job %s came back while a thread of this worker answers it; that thread ends it", taken.job)
            return None
        if taken.affinity_hit:
            with contextlib.suppress(redis.RedisError):  # a statistic
                self.fair.count_affinity_hit()
        return taken.job, taken.started

    def stop_taking(self) -> None:
        """Shutdown has begun: finish the jobs in hand, take no more (Celery waits for its threads to return)."""
        self._taking.clear()

    # -- background threads --------------------------------------------------------------------------------
    def _capacity(self, stats: dict | None = None) -> int:
        """Answers this worker takes at once: the engine's (rows and paused answers), at most its threads."""
        engine_slots = _engine_slots(stats or self.engine.stats())
        return engine_slots if self.threads is None else min(engine_slots, self.threads)

    def _sweep_unheld(self) -> None:
        """Put back in line the jobs Redis records as started on this worker that no thread of it holds, seen so on
        two heartbeat ticks in a row (a thread marks a job held within moments of starting it): a take or claim whose
        reply Redis never sent. The REQUEUE a lost worker's jobs get, so it counts as an attempt."""
        running = {j.decode() for j in self.r.smembers(self.keys.running(self.worker))}
        with self._lock:
            unheld = running - self._held
        stale = unheld & self._unheld_seen
        for job in stale:
            log.warning("job %s was started here but no thread holds it (a lost reply); putting it back in line", job)
            self.jobs.requeue(job, LOST_REPLY, only_worker=self.worker)
        self._unheld_seen = unheld - stale

    def _read_totals(self) -> None:
        workers = heartbeat.alive(self.r, self.keys)
        self._totals = (sum(w.capacity for w in workers.values()), sum(w.decode_rows for w in workers.values()))

    def _beat(self) -> None:
        stats = self.engine.stats()
        beat = heartbeat.Heartbeat(worker=self.worker, capacity=self._capacity(stats),
                                   rows=int(stats.get("max_running", 0)), model=model_name(self.engine),
                                   running=int(stats.get("running", 0)) + int(stats.get("prefilling", 0)),
                                   waiting=int(stats.get("waiting", 0)) + int(stats.get("paused", 0)),
                                   prefixes=self.routes.recent())
        heartbeat.publish(self.r, self.keys, beat, self.settings.heartbeat_ttl_s)
        self.metrics.observe_engine(stats)

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._beat()
                self._read_totals()
                self._sweep_unheld()
                self.reaper.sweep_if_due(self.settings.heartbeat_interval_s / 2)
                self.fair.dispatch()
            except Exception:  # a Redis hiccup must not stop the heartbeat for good
                log.exception("heartbeat tick failed")
            self._wake_dispatch.wait(self.settings.heartbeat_interval_s)
            if self._wake_dispatch.is_set() and not self._stop.is_set():
                self._wake_dispatch.clear()
                try:
                    self.fair.dispatch()
                except Exception:
                    log.exception("dispatch failed")

    def _cancel_loop(self) -> None:
        """Relay stopped jobs to the engine: one read a period of this worker's set of stopped jobs, however many
        jobs it runs (a job stays in the set until it ends, so one not handed to the engine yet is seen later)."""
        redis_down = False  # log an outage once, not 20 tracebacks a second
        key = self.keys.cancels(self.worker)
        while not self._stop.wait(self.settings.cancel_poll_s):
            with self._lock:
                if not self._active - self._aborted:
                    continue
            try:
                stopped = {raw.decode() for raw in self.r.smembers(key)}
            except redis.RedisError as exc:
                if not redis_down:
                    log.warning("cancel poll failed (%s); retrying until Redis answers", exc)
                redis_down = True
                continue
            redis_down = False
            with self._lock:
                jobs = sorted((self._active - self._aborted) & stopped)
                self._aborted.update(jobs)
            for job in jobs:
                self.engine.abort(job)
                self.metrics.cancels.inc()
