"""Runs one job on this worker: claim it, rebuild the chat from Redis, stream the engine's deltas.

Every path ends the job's stream with exactly one terminal event (written atomically with the job's
state by the finish script), and a bad job never takes the worker down. Its collaborators are explicit fields
(the runtime builds one ``JobRunner`` at start-up), and every job state change goes through a named
``JobStates`` method (``worker.job_states``): ``claim``, ``finish``.
"""
from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import asdict, dataclass
from typing import Protocol

import redis

from engine.outputs import FinishReason
from engine.sampling_params import SamplingParams
from worker.config import Settings
from worker.deltas import coalesced_deltas
from worker.errors import InvalidInput, NotYourConversation, OwletError
from worker.history import ConversationStore, turn_json
from worker.images import ImageStore
from worker.job_states import JobStates
from worker.jobs import Job, check_image_count, parse_job
from worker.keys import Keys
from worker.metrics import WorkerMetrics
from worker.queue_readouts import QueueReadouts
from worker.redis_retry import until_reachable
from worker.streams import StreamWriter

log = logging.getLogger(__name__)

INTERNAL_ERROR = "Owlet hit an internal error while answering. Please try again."
UNKNOWN_CONVERSATION = "This conversation no longer exists. Start a new conversation."
SERVICE_RESTARTING = "The chat service was restarting while answering. Please try again in a moment."


class EngineSlots(Protocol):
    """What the runner needs of the worker process around the engine (``WorkerRuntime`` provides it)."""

    def submit_to_engine(self, job_id: str, messages, sampling, conv: str, owner: str): ...
    def forget(self, job_id: str) -> None: ...
    def dispatch_soon(self) -> None: ...


@dataclass(frozen=True)
class JobRunner:
    """Runs jobs on this worker. Holds no per-job state, so one instance serves every task thread."""
    worker: str  # this worker's Celery node name: who claims, and who will hold the conversation's cache
    settings: Settings
    r: redis.Redis  # the job's payload and cancel flag, and its event stream
    keys: Keys
    jobs: JobStates  # job state transitions (claim, finish)
    readouts: QueueReadouts  # the service-time average each finished run is folded into
    convs: ConversationStore  # who owns the conversation
    images: ImageStore  # image bytes by sha256
    slots: EngineSlots  # hands requests to the engine and frees their slots
    metrics: WorkerMetrics

    def run(self, job_id, dispatch_n) -> None:
        if not isinstance(job_id, str) or not job_id:
            log.error("dropping a task with an invalid job id %r", job_id)
            return
        if not isinstance(dispatch_n, int) or isinstance(dispatch_n, bool):
            # never started here, so only a job still waiting for a worker may be ended by it
            if self.jobs.finish(job_id, "error", only_state="dispatched",
                                message="The job message is malformed (bad dispatch number)."):
                self.metrics.error("malformed")
            return
        if not self.jobs.claim(job_id, dispatch_n, self.worker):
            log.info("job %s dispatch %s is stale or already taken; skipping", job_id, dispatch_n)
            return
        try:
            self._run_claimed(job_id)
        except OwletError as exc:
            self._fail(job_id, exc.user_message, type(exc).__name__)
        except ValueError as exc:  # the engine and SamplingParams raise user-facing ValueErrors
            self._fail(job_id, str(exc), "invalid")
        except redis.RedisError:
            log.exception("job %s: Redis failed", job_id)
            self._fail(job_id, SERVICE_RESTARTING, "redis")
        except Exception:
            log.exception("job %s failed", job_id)
            self._fail(job_id, INTERNAL_ERROR, "internal")
        finally:
            self.slots.forget(job_id)
            self.slots.dispatch_soon()

    def _run_claimed(self, job_id: str) -> None:
        s = self.settings
        if self.r.exists(self.keys.cancel(job_id)):
            self._end(job_id, "cancelled")
            return
        payload, group = self.r.hmget(self.keys.job(job_id), "payload", "group")
        job = parse_job(payload, s.history_max_turns, s.history_max_chars)
        if job.job_id != job_id:
            raise InvalidInput("The job payload names a different job.")
        if self.convs.owner(job.conv) != job.user:
            raise NotYourConversation(UNKNOWN_CONVERSATION)
        sampling = SamplingParams.from_dict(job.sampling)
        messages = self._messages(job)
        started = time.monotonic()
        # The session cache's share is per client group (the address or login SUBMIT recorded), not per user:
        # one network minting many identities still holds one share.
        owner = group.decode() if isinstance(group, bytes) else group
        handle = self.slots.submit_to_engine(job_id, messages, sampling, job.conv, owner or job.user)
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
        with contextlib.suppress(redis.RedisError):  # a statistic: never worth losing the answer over
            self.readouts.record_service_time(time.monotonic() - started)
        self.metrics.tokens.inc(result.stats.generated_tokens)
        if result.stats.decode_tokens_per_s:
            self.metrics.tokens_per_s.set(result.stats.decode_tokens_per_s)
        self._finish_result(job, result)

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

    def _finish_result(self, job: Job, result) -> None:
        reason = result.finish_reason
        stats = asdict(result.stats)
        if reason in (FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH):
            answer = turn_json("assistant", result.text, job_id=job.job_id)
            self._end(job.job_id, "done", answer_turn=answer, holder=self.worker, text=result.text,
                      finish_reason=reason.value, stats=stats)
        elif reason == FinishReason.CANCELLED:
            self._end(job.job_id, "cancelled", text=result.text)
        elif reason == FinishReason.DEADLINE:
            self._fail(job.job_id, "Your answer took too long and was stopped. Try a shorter question "
                                   "or fewer tokens.", "deadline")
        else:
            self._fail(job.job_id, result.error or INTERNAL_ERROR, "engine")

    def _finish(self, job_id: str, event_type: str, **kwargs) -> bool:
        """The terminal event, retried while Redis restarts: a finished answer is delivered, not dropped."""
        return until_reachable(lambda: self.jobs.finish(job_id, event_type, only_state="started",
                                                        only_worker=self.worker, **kwargs),
                               self.settings.redis_reconnect_s, f"finishing job {job_id}")

    def _end(self, job_id: str, event_type: str, **kwargs) -> None:
        if self._finish(job_id, event_type, **kwargs):
            self.metrics.job_finished(event_type)

    def _fail(self, job_id: str, message: str, kind: str) -> None:
        if self._finish(job_id, "error", message=message):
            self.metrics.job_finished("error")
            self.metrics.error(kind)
