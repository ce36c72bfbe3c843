"""Runs one job on this worker: claim it, rebuild the chat from Redis, stream the engine's deltas.

Every path ends the job's stream with exactly one terminal event (written atomically with the job's
state by the finish script), and a bad job never takes the worker down. Its collaborators are explicit fields
(the runtime builds one ``JobRunner`` at start-up), and every job state change goes through a named
``JobStates`` method (``worker.queue.job_states``): ``claim``, ``take`` (through the runtime), ``finish``.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from typing import Protocol

import redis

from engine.outputs import FinishReason
from engine.sampling_params import SamplingParams
from worker.config import Settings
from worker.errors import InvalidInput, NotYourConversation, OwletError
from worker.history import ConversationStore, turn_json
from worker.images import ImageStore
from worker.jobs import Job, check_image_count, parse_job
from worker.keys import JobField, JobState, Keys
from worker.queue.job_states import JobStates, Started, Taken
from worker.queue.prefix_routes import route_keys
from worker.redis_retry import until_reachable
from worker.serving.deltas import coalesced_deltas
from worker.serving.metrics import WorkerMetrics
from worker.streams import StreamWriter

log = logging.getLogger(__name__)

INTERNAL_ERROR = "Owlet hit an internal error while answering. Please try again."
UNKNOWN_CONVERSATION = "This conversation no longer exists. Start a new conversation."
SERVICE_RESTARTING = "The chat service was restarting while answering. Please try again in a moment."


class EngineSlots(Protocol):
    """What the runner needs of the worker process around the engine (``WorkerRuntime`` provides it)."""

    def submit_to_engine(self, job_id: str, messages, sampling, conv: str, group: str, prefixes=()): ...
    def forget(self, job_id: str) -> None: ...
    def dispatch_soon(self) -> None: ...
    def hold(self, job_id: str) -> bool: ...
    def take_args(self) -> tuple[int, int, str] | None: ...
    def start_taken(self, taken: Taken) -> tuple[str, Started] | None: ...


@dataclass(frozen=True)
class JobRunner:
    """Runs jobs on this worker. Holds no per-job state, so one instance serves every task thread."""
    worker: str  # this worker's Celery node name: who claims, and who will hold the conversation's cache
    settings: Settings
    r: redis.Redis  # the job's payload and cancel flag, and its event stream
    keys: Keys
    jobs: JobStates  # job state transitions (claim, finish)
    convs: ConversationStore  # who owns the conversation
    images: ImageStore  # image bytes by sha256
    slots: EngineSlots  # hands requests to the engine and frees their slots
    metrics: WorkerMetrics

    def run(self, job_id, dispatch_n) -> None:
        """Run the job a Celery message names, then the jobs this worker takes itself, each with the finish of the one
        before, in the slot it freed (``JobStates.finish_and_take``): a row refills with no round trip of its own
        instead of a trip through Celery."""
        if not isinstance(job_id, str) or not job_id:
            log.error("dropping a task with an invalid job id %r", job_id)
            return
        if not isinstance(dispatch_n, int) or isinstance(dispatch_n, bool):
            # never started here, so only a job still waiting for a worker may be ended by it
            if self.jobs.finish(job_id, JobState.error, only_state=JobState.dispatched,
                                message="The job message is malformed (bad dispatch number)."):
                self.metrics.error("malformed")
            return
        started = self.jobs.claim(job_id, dispatch_n, self.worker)
        if started is None:
            log.info("job %s dispatch %s is stale or already taken; skipping", job_id, dispatch_n)
            return
        if not self.slots.hold(job_id):
            log.warning("job %s came back while a thread of this worker answers it; that thread ends it", job_id)
            return
        try:
            taken = self._serve(job_id, started)
            while taken is not None and (following := self.slots.start_taken(taken)) is not None:
                taken = self._serve(*following)
        finally:
            self.slots.dispatch_soon()

    def _serve(self, job_id: str, started: Started) -> Taken | None:
        """Run one claimed job to its terminal event; a failure ends that job, never the thread. Returns the job the
        finish took for this worker in the slot it freed (``JobStates.finish_and_take``), if any."""
        try:
            return self._run_claimed(job_id, started)
        except OwletError as exc:
            return self._fail(job_id, exc.user_message, type(exc).__name__)
        except ValueError as exc:  # the engine and SamplingParams raise user-facing ValueErrors
            return self._fail(job_id, str(exc), "invalid")
        except redis.RedisError:
            log.exception("job %s: Redis failed", job_id)
            return self._fail(job_id, SERVICE_RESTARTING, "redis")
        except Exception:
            log.exception("job %s failed", job_id)
            return self._fail(job_id, INTERNAL_ERROR, "internal")
        finally:
            self.slots.forget(job_id)

    def _run_claimed(self, job_id: str, started_job: Started) -> Taken | None:
        s = self.settings
        if started_job.cancelled:
            return self._end(job_id, JobState.cancelled)
        job = parse_job(started_job.payload, s.history_max_turns, s.history_max_chars)
        if job.job_id != job_id:
            raise InvalidInput("The job payload names a different job.")
        owner = started_job.owner if job.conv == started_job.conv else self.convs.owner(job.conv)
        if owner != job.user:
            raise NotYourConversation(UNKNOWN_CONVERSATION)
        sampling = SamplingParams.from_dict(job.sampling)
        messages = self._messages(job)
        started = time.monotonic()
        # The session cache's share is per client group (the address or login SUBMIT recorded), not per user:
        # one network minting many identities still holds one share.
        # The route keys of a first question's prefixes, which this worker now holds: announced for prefix routing.
        handle = self.slots.submit_to_engine(job_id, messages, sampling, job.conv, started_job.group or job.user,
                                             prefixes=route_keys(job.messages))
        writer = StreamWriter(self.r, self.keys, job_id, s.stream_maxlen)
        last = None
        for text, n_deltas in coalesced_deltas(handle, s.stream_coalesce_s):
            now = time.monotonic()
            if last is None:
                self.metrics.ttft_s.observe(now - started)
            else:  # one observation per token, as before coalescing: the tokens of one write share its gap
                gap = (now - last) / n_deltas
                for _ in range(n_deltas):
                    self.metrics.tpot_s.observe(gap)
            last = now
            writer.add("token", text=text)
        result = handle.result(timeout=s.job_deadline_s)
        self.metrics.tokens.inc(result.stats.generated_tokens)
        if result.stats.decode_tokens_per_s:
            self.metrics.tokens_per_s.set(result.stats.decode_tokens_per_s)
        # the run time goes into the service-time average with the finish (one round trip for both)
        return self._finish_result(job, result, time.monotonic() - started)

    def _messages(self, job: Job) -> list[dict]:
        """The engine's chat: consecutive turns of one role (e.g. an unanswered question) are merged.

        Images are counted before any is decoded, and each stored image is decoded once however often the
        conversation shows it."""
        check_image_count(job.messages, self.settings.max_images_per_request)
        loaded: dict[str, object] = {}
        out: list[dict] = []
        for m in job.messages:
            content = []
            if m.image_sha:
                if m.image_sha not in loaded:
                    loaded[m.image_sha] = self.images.load(m.image_sha, self.settings.image_max_side)
                content.append({"type": "image", "image": loaded[m.image_sha]})
            content.append({"type": "text", "text": m.text})
            if out and out[-1]["role"] == m.role:
                out[-1]["content"].extend(content)
            else:
                out.append({"role": m.role, "content": content})
        return out

    def _finish_result(self, job: Job, result, service_s: float) -> Taken | None:
        reason = result.finish_reason
        stats = asdict(result.stats)
        if reason in (FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH):
            answer = turn_json("assistant", result.text, job_id=job.job_id)
            return self._end(job.job_id, JobState.done, answer_turn=answer, holder=self.worker, text=result.text,
                             finish_reason=reason.value, stats=stats, service_s=service_s)
        elif reason == FinishReason.CANCELLED:
            return self._end(job.job_id, JobState.cancelled, text=result.text, service_s=service_s)
        elif reason == FinishReason.DEADLINE:
            return self._fail(job.job_id, "Your answer took too long and was stopped. Try a shorter question "
                              "or fewer tokens.", "deadline", service_s)
        else:
            return self._fail(job.job_id, result.error or INTERNAL_ERROR, "engine", service_s)

    def _finish(self, job_id: str, event_type: str, **kwargs) -> tuple[bool, Taken | None]:
        """The terminal event, retried while Redis restarts: a finished answer is delivered, not dropped. With it,
        the worker's next job in the freed slot (``EngineSlots.take_args``; a retry after a lost reply ends nothing
        and so takes nothing)."""
        take = self.slots.take_args()
        return until_reachable(lambda: self.jobs.finish_and_take(job_id, event_type, only_state=JobState.started,
                                                                 only_worker=self.worker, take=take, **kwargs),
                               self.settings.redis_reconnect_s, f"finishing job {job_id}")

    def _end(self, job_id: str, event_type: str, **kwargs) -> Taken | None:
        ended, taken = self._finish(job_id, event_type, **kwargs)
        if ended:
            self.metrics.job_finished(event_type)
        return taken

    def _fail(self, job_id: str, message: str, kind: str, service_s: float | None = None) -> Taken | None:
        """End the job with ``message`` for its user; ``kind`` (the metric's label) goes into the error event too,
        so a client can tell a refused question (``invalid``) from a failure of the service."""
        ended, taken = self._finish(job_id, JobState.error, message=message, kind=kind, service_s=service_s)
        if ended:
            self.metrics.job_finished(JobState.error)
            self.metrics.error(kind)
        return taken
