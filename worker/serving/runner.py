"""Serves one started job: rebuild the chat from Redis, stream the engine's deltas, say how the job ended.

The runner holds no per-job state and calls nothing back: ``WorkerRuntime`` (``worker.serving.runtime``) starts a
job, hands it to ``JobRunner.serve``, and ends it with the ``JobResult`` it gets back. A bad job becomes an error
result, never an exception out of ``serve``, so it never takes the worker down.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace

import redis

from engine.outputs import FinishReason
from engine.sampling_params import SamplingParams
from worker.config import Settings
from worker.errors import InvalidInput, NotYourConversation, OwletError
from worker.store.history import ConversationStore, turn_json
from worker.store.images import ImageStore
from worker.store.jobs import Job, check_image_count, parse_job
from worker.store.keys import TOKEN_EVENT, JobState, Keys
from worker.queue.job_states import Started
from worker.queue.prefix_routes import route_keys
from worker.serving.deltas import coalesced_deltas
from worker.serving.metrics import WorkerMetrics
from worker.store.stream_batcher import StreamBatcher
from worker.store.streams import StreamWriter

log = logging.getLogger(__name__)

INTERNAL_ERROR = "Owlet hit an internal error while answering. Please try again."
UNKNOWN_CONVERSATION = "This conversation no longer exists. Start a new conversation."
SERVICE_RESTARTING = "The chat service was restarting while answering. Please try again in a moment."


@dataclass(frozen=True)
class JobResult:
    """How a served job ends, for its finish (``JobStates.finish_and_take``): the state it ends in (also its terminal
    event's type), that event's fields, and what the finish records with it."""
    state: str  # JobState.done | cancelled | error
    event: dict = field(default_factory=dict)  # text, finish_reason, stats; an error's message and kind
    answer_turn: str | None = None  # appended to the conversation (done)
    holder: str | None = None  # the worker that now holds the conversation's cache (done)
    service_s: float | None = None  # the run time, folded into the service-time average
    # route keys of the first question's prompt prefixes this worker now holds (done): its heartbeat announces them
    # for prefix routing (worker.queue.prefix_routes)
    routes: tuple[str, ...] = ()
    # the answer's last token write, not sent yet: the finish writes it just before the terminal event, in the same
    # script call ('' = none), so an answer's end costs no round trip of its own
    tail: str = ""

    @property
    def error_kind(self) -> str | None:
        """An error's kind, the metric's label (``invalid``: the question itself was refused)."""
        return self.event.get("kind") if self.state == JobState.error else None


def failed(message: str, kind: str, service_s: float | None = None) -> JobResult:
    """An error for the job's user; ``kind`` goes into the error event too, so a client can tell a refused question
    (``invalid``) from a failure of the service."""
    return JobResult(JobState.error, dict(message=message, kind=kind), service_s=service_s)


def failure(job_id: str, exc: Exception) -> JobResult:
    """The error result an exception raised while serving (or finishing) a job ends it with."""
    if isinstance(exc, OwletError):
        return failed(exc.user_message, type(exc).__name__)
    if isinstance(exc, ValueError):  # the engine and SamplingParams raise user-facing ValueErrors
        return failed(str(exc), "invalid")
    if isinstance(exc, redis.RedisError):
        log.error("job %s: Redis failed", job_id, exc_info=exc)
        return failed(SERVICE_RESTARTING, "redis")
    log.error("job %s failed", job_id, exc_info=exc)
    return failed(INTERNAL_ERROR, "internal")


@dataclass(frozen=True)
class JobRunner:
    """Serves jobs on this worker. Holds no per-job state, so one instance serves every task thread."""
    worker: str  # this worker's Celery node name: who will hold the conversation's cache
    settings: Settings
    r: redis.Redis  # the job's event stream
    keys: Keys
    convs: ConversationStore  # who owns the conversation
    images: ImageStore  # image bytes by sha256
    engine: object  # ``engine.LLMEngine`` (or the page benchmark's stub): ``add_request`` returns a handle
    metrics: WorkerMetrics
    batcher: StreamBatcher | None = None  # the worker's token writes, sent together (None: each on its own)

    def serve(self, job_id: str, started: Started) -> JobResult:
        """Run one started job to its result; a failure becomes an error result, never an exception."""
        try:
            return self._answer(job_id, started)
        except Exception as exc:
            return failure(job_id, exc)

    def _answer(self, job_id: str, started_job: Started) -> JobResult:
        s = self.settings
        if started_job.cancelled:
            return JobResult(JobState.cancelled)
        job = parse_job(started_job.payload, s.history_max_turns, s.history_max_chars, history=started_job.history,
                        turn=started_job.turn)
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
        handle = self.engine.add_request(messages, sampling, session_id=job.conv, request_id=job_id,
                                         deadline_s=s.job_deadline_s, group=started_job.group or job.user)
        writer = StreamWriter(self.r, self.keys, job_id, s.stream_maxlen, self.batcher)
        last, tail = None, ""
        try:
            for text, n_deltas, ended in coalesced_deltas(handle, s.stream_coalesce_s):
                now = time.monotonic()
                if last is None:
                    self.metrics.ttft_s.observe(now - started)
                else:  # one observation per token, as before coalescing: the tokens of one write share its gap
                    gap = (now - last) / n_deltas
                    for _ in range(n_deltas):
                        self.metrics.tpot_s.observe(gap)
                last = now
                if ended:
                    tail = text  # written by the finish, with the terminal event
                else:
                    writer.add(TOKEN_EVENT, text=text)
        except BaseException:
            writer.flush()  # every earlier token is in the stream before the job's terminal event
            raise
        # the tokens still waiting for the batcher's round trip go with the finish too, before the last ones (every
        # token already on its way is in the stream first)
        tail = writer.take_unsent() + tail
        result = handle.result(timeout=s.job_deadline_s)
        self.metrics.tokens.inc(result.stats.generated_tokens)
        if result.stats.decode_tokens_per_s:
            self.metrics.tokens_per_s.set(result.stats.decode_tokens_per_s)
        # the run time goes into the service-time average with the finish (one round trip for both)
        return replace(self._result(job, result, time.monotonic() - started), tail=tail)

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

    def _result(self, job: Job, result, service_s: float) -> JobResult:
        reason = result.finish_reason
        if reason in (FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH):
            answer = turn_json("assistant", result.text, job_id=job.job_id)
            return JobResult(JobState.done, dict(text=result.text, finish_reason=reason.value,
                                                 stats=asdict(result.stats)),
                             answer_turn=answer, holder=self.worker, service_s=service_s,
                             routes=tuple(route_keys(job.messages)))
        elif reason == FinishReason.CANCELLED:
            return JobResult(JobState.cancelled, dict(text=result.text), service_s=service_s)
        elif reason == FinishReason.DEADLINE:
            return failed("Your answer took too long and was stopped. Try a shorter question or fewer tokens.",
                          "deadline", service_s)
        else:
            return failed(result.error or INTERNAL_ERROR, "engine", service_s)
