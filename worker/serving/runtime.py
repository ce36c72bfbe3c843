"""Everything one worker process owns: its engine, Redis clients, heartbeat and cancel-watch threads, and the life
of every job it runs.

A job's life is one loop in ``WorkerRuntime.run_job``, a Celery task thread's: claim the job the message names,
serve it (``JobRunner.serve`` returns a ``JobResult``), finish it and take this worker's next job in the same step
(``JobStates.finish_and_take``), serve that one, and so on until a finish takes nothing. Whatever started a job in
Redis, it starts here through ``WorkerRuntime._start``.

Created in Celery's worker_init signal (``worker.celery_app``), so importing the worker loads nothing.
The heartbeat thread also runs the reaper sweep and a dispatch pass on every tick, which keeps the
service work-conserving even when no UI process is submitting.
"""
from __future__ import annotations

import contextlib
import importlib
import logging
import threading

import redis

from engine.models.checkpoint_folder import served_name
from owlet.allocator import start_trimming
from worker import heartbeat, held_conversations
from worker.config import Settings
from worker.store.history import ConversationStore
from worker.store.images import ImageStore
from worker.store.keys import JobState, Keys
from worker.store.stream_batcher import StreamBatcher
from worker.queue.dispatch import FairDispatch
from worker.queue.job_states import JobStates, Started, Taken
from worker.queue.prefix_routes import HeldRoutes
from worker.queue.readouts import QueueReadouts
from worker.queue.reaper import Reaper
from worker.serving.metrics import WorkerMetrics
from worker.redis_probe import evicting_policy
from worker.redis_retry import until_reachable
from worker.serving.runner import JobResult, JobRunner, failure
from worker.serving.startup import CannotServe, metrics_port_taken

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
    """The checkpoint an engine serves, by its folder's name, or its repository's for a folder in the Hugging Face
    cache ("" for an engine without one, e.g. the stub)."""
    model = getattr(getattr(engine, "config", None), "model", "")
    return served_name(model) if isinstance(model, str) and model else ""


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
        self.routes = HeldRoutes()  # first questions it ran, announced for prefix routing (worker.queue.prefix_routes)
        # Job ids a thread of this worker holds, from the claim (or take) that started them to their end. A job Redis
        # records as started here that no thread holds was taken by a script whose reply was lost (Redis went away
        # between running it and answering): _sweep_unheld puts it back in line.
        self._held: set[str] = set()
        self._unheld_seen: set[str] = set()
        self._aborted: set[str] = set()  # held jobs whose stop the engine has been told of
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_dispatch = threading.Event()
        self._threads: list[threading.Thread] = []
        self._metrics_server = None
        self.batcher = StreamBatcher(self.r)  # the token writes between each answer's first and last, batched
        self.runner = JobRunner(worker=worker, settings=settings, r=self.r, keys=self.keys, convs=self.convs,
                                images=self.images, engine=self.engine, metrics=self.metrics, batcher=self.batcher)
        # The live workers' slots and decode rows in all (the capacity POP checks), read on every heartbeat tick:
        # a worker taking its next job itself (``_take_args``) uses the last reading instead of a round trip per job.
        self._totals = (0, 0)
        self._taking = threading.Event()  # set while this worker takes jobs itself; cleared when shutdown starts
        if settings.worker_takes_next:
            self._taking.set()

    # -- life cycle ----------------------------------------------------------------------------------------
    def start(self) -> None:
        self._check_redis_keeps_everything()
        self._check_one_checkpoint()
        self.engine.start()
        adopted = self.jobs.adopt_line()  # questions left waiting by an earlier version of the line
        if adopted:
            log.info("owlet worker %s: %d client groups waiting in the line's earlier form put in line", self.worker,
                     adopted)
        if self.settings.worker_metrics_port:  # up before the heartbeat says this worker is
            try:
                self._metrics_server = self.metrics.serve(self.settings.worker_metrics_port)
            except OSError as exc:
                raise CannotServe(metrics_port_taken(self.settings.worker_metrics_port, exc)) from None
        self._beat()  # announce capacity before the first job can arrive
        self._claim_held()
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

    def _check_redis_keeps_everything(self) -> None:
        """Refuse a Redis that evicts keys when full (``redis_probe.evicting_policy``): the queue's promise that no
        turn vanishes rests on Redis refusing writes, never dropping what it holds."""
        evicting = evicting_policy(self.r)
        if evicting:
            policy, maxmemory = evicting
            raise CannotServe(
                f"Redis evicts keys once it holds maxmemory ({maxmemory:,} bytes): its maxmemory-policy is {policy}, "
                "so questions in line, answers and conversations would vanish without a word. Set maxmemory-policy "
                "noeviction (a full Redis then refuses a new turn whole, and the visitor is told; "
                "docs/redis_memory.md).")

    def _check_one_checkpoint(self) -> None:
        """Refuse to join a queue that live workers serve with another checkpoint (``heartbeat.other_models``): the
        line hands a question to whichever worker takes it, so a second model would answer some of them, silently,
        under the name the client asked for."""
        mine = model_name(self.engine)
        others = heartbeat.other_models(self.r, self.keys, self.worker, mine, self.settings.heartbeat_ttl_s)
        if others:
            raise CannotServe(
                f"the workers already serving this queue (key prefix {self.keys.prefix!r} on its Redis) serve "
                f"{', '.join(repr(m) for m in others)}, and this one serves {mine!r}. One queue serves one checkpoint: "
                "with two, each question would be answered by whichever worker took it. Stop those workers first, "
                "or give this one a queue of its own (OWLET_KEY_PREFIX).")

    def _claim_held(self) -> None:
        """Conversations the engine found on disk (a restart on the same OWLET_DISK_CACHE_DIR): route their
        follow-ups here (``worker.held_conversations``)."""
        convs = self.engine.stats().get("disk_sessions") or ()
        if convs:
            claimed = held_conversations.claim(self.r, self.keys, self.worker, convs, self.settings.holder_ttl_s)
            log.info("owlet worker %s: holds %d conversations on disk, now their holder for %d", self.worker,
                     len(convs), claimed)

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
        self.batcher.close()

    # -- jobs: claim -> serve -> finish and take -> next ----------------------------------------------------------
    def run_job(self, job_id, dispatch_n) -> None:
        """Celery's task: claim the job its message names, serve it, and then the jobs each finish takes for this
        worker in the slot it freed (``JobStates.finish_and_take``): a row refills with no round trip of its own
        instead of a trip through Celery. The thread returns once a finish takes nothing."""
        started = self._claim(job_id, dispatch_n)
        job = self._start(job_id, started) if started is not None else None
        if job is None:
            return
        line_was_empty = False
        try:
            while job is not None:
                taken, took = self._serve(*job)
                line_was_empty = took and taken is None
                job = self._next(taken)
        finally:
            # A slot was freed: the heartbeat thread dispatches now, not at its next tick; unless the finish that freed
            # it took the next job in the same step and found none for it (the same POP a pass runs, a moment earlier:
            # a pass now would read the heartbeats and run POP for nothing, three round trips, and a question asked
            # after the take is dispatched by its own SUBMIT).
            if not line_was_empty:
                self._wake_dispatch.set()

    def _claim(self, job_id, dispatch_n) -> Started | None:
        """CLAIM the job a Celery message names (``JobStates.claim``); None for a malformed, stale or duplicate
        message."""
        if not isinstance(job_id, str) or not job_id:
            log.error("dropping a task with an invalid job id %r", job_id)
            return None
        if not isinstance(dispatch_n, int) or isinstance(dispatch_n, bool):
            # never started here, so only a job still waiting for a worker may be ended by it
            if self.jobs.finish(job_id, JobState.error, only_state=JobState.dispatched,
                                message="The job message is malformed (bad dispatch number)."):
                self.metrics.error("malformed")
            return None
        started = self.jobs.claim(job_id, dispatch_n, self.worker)
        if started is None:
            log.info("job %s dispatch %s is stale or already taken; skipping", job_id, dispatch_n)
        return started

    def _start(self, job_id: str, started: Started) -> tuple[str, Started] | None:
        """Every job this worker runs starts here, whatever started it in Redis (a Celery message's claim or a
        finish's take): a thread of this worker now holds it, and will end it. None when another thread of this
        worker holds it already: it was put back in line while it ran here (this worker was presumed lost, its
        heartbeat late on an overloaded host) and came back; the thread already answering it ends it."""
        if not self.hold(job_id):
            log.warning("job %s came back while a thread of this worker answers it; that thread ends it", job_id)
            return None
        return job_id, started

    def hold(self, job_id: str) -> bool:
        """Mark ``job_id`` held by a thread of this worker; False when one holds it already."""
        with self._lock:
            if job_id in self._held:
                return False
            self._held.add(job_id)
            return True

    def _serve(self, job_id: str, started: Started) -> tuple[Taken | None, bool]:
        """Serve one started job and end it (a failure ends that job, never the thread). Returns the job its finish
        took for this worker, if any, and whether the finish asked for one (``_finish``)."""
        try:
            result = self.runner.serve(job_id, started)
            self.routes.add(result.routes)
            return self._finish(job_id, result)
        except Exception as exc:  # the finish itself failed: end the job with that error instead
            return self._finish(job_id, failure(job_id, exc))
        finally:
            with self._lock:
                self._held.discard(job_id)
                self._aborted.discard(job_id)

    def _finish(self, job_id: str, result: JobResult) -> tuple[Taken | None, bool]:
        """The terminal event, retried while Redis restarts (a finished answer is delivered, not dropped), and with it
        this worker's next job in the slot the job freed (a retry after a lost reply ends nothing and so takes
        nothing). Returns that job, and whether the finish ended the job and asked for one (then None means POP
        had nothing for the slot)."""
        take = self._take_args()
        ended, taken = until_reachable(
            lambda: self.jobs.finish_and_take(job_id, result.state, answer_turn=result.answer_turn,
                                              holder=result.holder, only_state=JobState.started,
                                              only_worker=self.worker, service_s=result.service_s, take=take,
                                              tail=result.tail, **result.event),
            self.settings.redis_reconnect_s, f"finishing job {job_id}")
        if ended:
            self.metrics.job_finished(result.state)
            if result.error_kind is not None:
                self.metrics.error(result.error_kind)
        return taken, bool(ended) and take is not None

    def _take_args(self) -> tuple[int, int, str] | None:
        """(capacity, decode rows, this worker) for a finish or take of this worker's next job; None while it takes
        none (shutting down, the setting off, no heartbeat read yet)."""
        capacity, rows = self._totals
        return (capacity, rows, self.worker) if self._taking.is_set() and capacity > 0 else None

    def _next(self, taken: Taken | None, tries: int = 4) -> tuple[str, Started] | None:
        """The job a finish took for this worker, started here. One whose conversation another worker holds is sent to
        it (``FairDispatch.send``) and the next of the fair queue taken in its place (``JobStates.take``), ``tries``
        times at most. None: nothing waits, no slot is free, the worker is shutting down, or the setting is off."""
        for attempt in range(tries + 1):
            if taken is None:
                return None
            if taken.started is not None:
                job = self._start(taken.job, taken.started)
                if job is not None and taken.affinity_hit:
                    with contextlib.suppress(redis.RedisError):  # a statistic
                        self.fair.count_affinity_hit()
                return job
            try:
                self.fair.send(taken.job, taken.dispatch_n, taken.conv)
            except redis.RedisError as exc:  # still dispatched: the reaper re-queues it after its grace
                log.warning("sending job %s on failed (%s)", taken.job, exc)
                return None
            taken = self._take() if attempt < tries else None
        return None

    def _take(self) -> Taken | None:
        """The next job of the fair queue, started on this worker in the slot a job of its own just freed
        (``JobStates.take``), or None."""
        take = self._take_args()
        if take is None:
            return None
        try:
            return self.jobs.take(*take)
        except redis.RedisError as exc:  # the thread returns to Celery; dispatch passes carry on
            log.warning("taking the next job failed (%s)", exc)
            return None

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
        jobs it runs (a job stays in the set until it ends, so one not handed to the engine yet is told again at the
        next read, until the engine knows it)."""
        redis_down = False  # log an outage once, not 20 tracebacks a second
        key = self.keys.cancels(self.worker)
        while not self._stop.wait(self.settings.cancel_poll_s):
            with self._lock:
                if not self._held - self._aborted:
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
                jobs = sorted((self._held - self._aborted) & stopped)
            for job in jobs:
                if not self.engine.abort(job):  # not handed to the engine yet, or ended there already
                    continue
                self.metrics.cancels.inc()
                with self._lock:
                    if job in self._held:
                        self._aborted.add(job)
