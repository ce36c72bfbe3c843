"""LLMEngine: continuous batching over a Hugging Face VLM.

What it knows: chats (text + PIL images), sampling parameters, token ids, KV caches, deadlines.
What it does not know: Celery, Redis, Gradio, users. It takes requests and gives back text deltas and a
final result; everything distributed lives in worker/, everything the user sees in ui/.

One step is: take in new requests and aborts → pause rows that other groups' waiting answers are owed
(``engine.time_slicing``) → prefill or resume what the scheduler picked (new prompts together in few forwards,
engine/batch/prefill_batch.py; a follow-up turn or a later chunk alone) →
one batched decode step → emit deltas and drop finished rows. Any thread may call
``add_request`` and ``abort``; only the loop thread (or a caller of ``step``) touches the model.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from collections import deque

import torch

from .kv import kv_cache
from .batch import prefill_batch
from .config import EngineConfig
from .batch.decode_batch import make_decode_batch
from .detokenizer import IncrementalDetokenizer
from .models.runners import make_runner
from .handle import RequestHandle
from .outputs import FinalResult, FinishReason
from .prompt import PromptBuilder
from .request import Request, RunnerScratch, Status, Where
from .models.runner_interface import Runner
from .sampler import make_generator, penalised, sample_next_tokens
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .time_slicing import rows_to_pause

log = logging.getLogger("owlet.engine")


class LLMEngine:
    def __init__(self, config: EngineConfig, runner: Runner | None = None):
        self.config = config
        self.runner: Runner = runner or make_runner(config)  # the family registry picks it (engine/models/families.py)
        self.prompts = PromptBuilder(self.runner.processor, self.runner.image_token_id,
                                     placeholder=self.runner.image_placeholder,
                                     max_image_pixels=config.max_image_pixels,
                                     max_images=config.max_images_per_request)
        self.max_model_len = min(n for n in (config.max_model_len, self.runner.max_model_len) if n)
        # what a request that names none gets: the checkpoint's generation_config.json says (1.0: none)
        self.repetition_penalty = getattr(self.runner, "repetition_penalty", 1.0)
        self.batch = make_decode_batch(config, self.runner, self.max_model_len)  # the family row picks which
        self.max_model_len = self.batch.max_len  # a slot's length may cap the context below the model's
        self.sessions = self.runner.session_store_class.for_runner(config, self.runner)
        mode = config.batched_prefill  # auto: on a CUDA device (engine/config.py says why not on CPU)
        self._batched_prefill = mode == "on" or (mode == "auto" and self.runner.device.type == "cuda")
        self.scheduler = Scheduler(config.max_running, config.max_prefill_tokens, prefix_cache=self.sessions)
        self._inbox: deque[Request] = deque()
        self._aborts: set[str] = set()
        self._live: dict[str, Request] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._counters = dict(steps=0, decode_steps=0, decode_rows=0, prefill_tokens=0, generated_tokens=0,
                              requests_finished=0, requests_failed=0, requests_cancelled=0, step_errors=0,
                              oom_events=0, pauses=0, prefill_forwards=0,
                              prefill_batched_rows=0, prefill_batch_fallbacks=0)

    # -- public API (any thread) ----------------------------------------------
    def add_request(self, messages, sampling: SamplingParams | None = None, *, session_id: str | None = None,
                    request_id: str | None = None, deadline_s: float | None = None,
                    group: str | None = None) -> RequestHandle:
        """Validate and enqueue one chat turn. Raises ValueError with a user-facing message on bad input.

        ``group`` names who the conversation belongs to for the session cache's fair share
        (``EngineConfig.session_group_share``); None: not capped."""
        sampling = sampling or SamplingParams()
        if not isinstance(sampling, SamplingParams):
            raise ValueError("sampling must be a SamplingParams")
        if sampling.repetition_penalty is None:  # the checkpoint's own (engine/models/generation_defaults.py)
            sampling = dataclasses.replace(sampling, repetition_penalty=self.repetition_penalty)
        if deadline_s is not None and not (isinstance(deadline_s, (int, float)) and deadline_s > 0):
            raise ValueError(f"deadline_s must be a positive number of seconds, got {deadline_s!r}")
        prompt = self.prompts.build(messages)
        max_len = self.max_model_len
        if len(prompt.token_ids) >= max_len:
            question = self.prompts.question_tokens(messages)
            if question >= max_len // 2:  # shortening the question is what helps, not a new conversation
                raise ValueError(f"this question is too long for the model: {question} tokens, and its context "
                                 f"holds {max_len} for the question, the conversation before it and the answer. "
                                 f"Ask a shorter question.")
            if len(prompt.head_ids) >= max_len // 2:  # a system prompt: a new conversation would bring it again
                raise ValueError(f"the system prompt is too long for the model: {len(prompt.head_ids)} tokens, and "
                                 f"its context holds {max_len} for it, the conversation and the answer. Shorten the "
                                 f"system prompt.")
            raise ValueError(f"the conversation is too long: {len(prompt.token_ids)} tokens, and the model's "
                             f"context holds {max_len}. Start a new conversation or use a smaller image.")
        request_id = request_id or uuid.uuid4().hex
        budget = deadline_s if deadline_s is not None else self.config.default_deadline_s
        req = Request(
            request_id=request_id, prompt=prompt, params=sampling, handle=RequestHandle(request_id),
            detokenizer=IncrementalDetokenizer(self.runner.processor.tokenizer, sampling.stop),
            session_id=session_id, group=group, max_len=max_len,
            deadline=None if budget is None else time.monotonic() + budget,
            generator=make_generator(sampling, self.config.seed),
        )
        with self._lock:
            if request_id in self._live:
                raise ValueError(f"request id {request_id!r} is already in use")
            if len(self._inbox) + len(self.scheduler.waiting) >= self.config.max_waiting:
                raise ValueError("the engine is at capacity; try again in a moment")
            self._live[request_id] = req
            self._inbox.append(req)
        self._wakeup.set()
        return req.handle

    def abort(self, request_id: str) -> bool:
        """Cancel a request; it finishes with CANCELLED at the start of the next step. False if unknown."""
        with self._lock:
            if request_id not in self._live:
                return False
            self._aborts.add(request_id)
        self._wakeup.set()
        return True

    def start(self) -> "LLMEngine":
        assert self._thread is None, "engine already started"
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="owlet-engine", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; requests still in flight finish with CANCELLED so no caller waits forever."""
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            leftovers = list(self._live.values())
        for req in leftovers:
            self._finish(req, FinishReason.CANCELLED, error="the engine shut down")
        self.sessions.close()

    def has_work(self) -> bool:
        return bool(self._inbox or self.scheduler.waiting or self.scheduler.prefilling or len(self.batch))

    def stats(self) -> dict:
        c = self._counters
        paused = sum(r.status is Status.PAUSED for r in list(self.scheduler.waiting))
        return dict(
            running=len(self.batch), prefilling=len(self.scheduler.prefilling), paused=paused,
            waiting=len(self.scheduler.waiting) - paused + len(self._inbox), max_running=self.config.max_running,
            max_active=self.config.max_active, time_slice_tokens=self.config.time_slice_tokens,
            mean_batch_occupancy=(c["decode_rows"] / c["decode_steps"]) if c["decode_steps"] else 0.0,
            device=str(self.runner.device), dtype=str(self.runner.dtype).replace("torch.", ""),
            weight_copy_bytes=self.runner.weight_copy_bytes,
            image_cache=dict(hits=self.runner.image_features.hits, misses=self.runner.image_features.misses,
                             evictions=self.runner.image_features.evictions,
                             bytes=self.runner.image_features.bytes_held),
            **self.sessions.stats(), **c,
        )

    # -- the loop ---------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stopping:
            if not self.has_work() and not self._aborts:
                self._wakeup.wait(timeout=0.5)
                self._wakeup.clear()
                continue
            try:
                self.step()
            except Exception:  # noqa: BLE001 — a broken invariant: fail what is in flight, keep serving
                log.exception("engine step failed outside any one request; failing every request in flight")
                self._counters["step_errors"] += 1
                self._fail_in_flight("the server hit an internal error; please ask again")

    def _fail_in_flight(self, error: str) -> None:
        for req in self.scheduler.pending() + list(self.batch.requests):
            self._finish(req, FinishReason.ERROR, error=error)
        self.batch.filter([])

    def step(self) -> None:
        """schedule → prefill → decode → postprocess. Failures fail only the requests involved."""
        self._counters["steps"] += 1
        self._admit_and_expire()
        self._time_slice()
        plan = self.scheduler.schedule(self.batch.requests)
        together = [(req, n) for req, n in plan if req.status is not Status.PAUSED
                    and self.runner.can_prefill_together(req)] if self._batched_prefill else []
        if len(together) < 2:
            together = []
        batched = {id(req) for req, _ in together}
        for req, n_tokens in plan:
            if req.status is Status.PAUSED:
                self._resume(req)
            elif id(req) not in batched:
                self._prefill(req, n_tokens)
        if together:
            self._prefill_groups(together)
        if len(self.batch):
            self._decode()

    def _time_slice(self) -> None:
        """Pause the rows that waiting answers of groups holding fewer rows are owed (engine.time_slicing)."""
        if not self.config.time_slice_tokens or not self.scheduler.waiting:
            return
        victims = rows_to_pause(self.batch.requests, self.scheduler.prefilling, self.scheduler.waiting,
                                self.config.max_running, self.config.time_slice_tokens)
        if not victims:
            return
        host = torch.device("cpu")  # a paused row's cache waits in host memory, not in the accelerator's
        for req in victims:
            snap = self.batch.snapshot(req)
            assert snap.length == req.num_tokens - 1, "a row's cache must hold all but its pending token"
            req.kv.move(Where.PARKED, kv_cache.moved(snap, host))
            req.status = Status.PAUSED
            req.slicing.pauses += 1
            self._counters["pauses"] += 1
        self.batch.filter([i for i, r in enumerate(self.batch.requests) if r.status is Status.RUNNING])
        for req in victims:
            self.scheduler.add(req)

    def _resume(self, req: Request) -> None:
        """A paused answer's turn: its cache goes back into a row exactly as it left, and decoding goes on."""
        assert req.kv.where is Where.PARKED, f"resuming {req.request_id} whose cache is {req.kv.where}"
        parked = req.kv.data
        try:
            cache = kv_cache.cache_from_snapshot(kv_cache.moved(parked, self.runner.device), self.runner.text_config)
            self.batch.add(req, cache, parked.length, req.output_ids[-1])
        except torch.OutOfMemoryError:
            self._counters["oom_events"] += 1
            log.warning("out of memory resuming %s; freed %d session bytes, retrying", req.request_id,
                        self.sessions.evict_all())
            self.scheduler.retry(req)
            return
        except Exception as exc:  # noqa: BLE001 — one bad request must not stop the engine
            log.exception("resuming %s failed", req.request_id)
            self._counters["step_errors"] += 1
            self._finish(req, FinishReason.ERROR, error=f"the model failed mid-answer ({type(exc).__name__})")
            return
        req.kv.move(Where.IN_ROW)
        req.status = Status.RUNNING
        req.slicing.start = len(req.output_ids)
        req.slicing.overtaken = 0  # the bound on newcomers going first holds per wait

    def _admit_and_expire(self) -> None:
        with self._lock:
            new = list(self._inbox)
            self._inbox.clear()
            aborts, self._aborts = self._aborts, set()
        if self.config.admit_longest_first:  # only within this intake: no request overtakes an earlier arrival
            new.sort(key=lambda r: -r.params.max_new_tokens)
        for req in new:
            self.scheduler.add(req)
        now = time.monotonic()
        for req in self.scheduler.pending() + list(self.batch.requests):
            if req.request_id in aborts:
                self._finish(req, FinishReason.CANCELLED)
            elif req.deadline is not None and now > req.deadline:
                self._finish(req, FinishReason.DEADLINE,
                             error="the answer took longer than its deadline; try a shorter question or try again")
        self._drop_finished_rows()

    def _prefill_groups(self, together: list[tuple[Request, int]]) -> None:
        """Batched prefill (engine/batch/prefill_batch.py): the rows that start fresh, in forwards of similar lengths, the
        shortest first (their first tokens come out soonest, as a shortest-job-first queue would have them)."""
        lengths = [req.num_computed + n for req, n in together]
        for group in reversed(prefill_batch.groups(lengths)):
            rows = [together[i] for i in group]
            if len(rows) == 1:
                self._prefill(*rows[0])
            else:
                self._prefill_together(rows)

    def _prefill_together(self, rows: list[tuple[Request, int]]) -> None:
        """Prefill ``rows`` in one forward; if it fails (out of memory, a bad input), one at a time instead, so the
        failure is met by the one request it belongs to."""
        requests, n_tokens = [req for req, _ in rows], [n for _, n in rows]
        try:
            logits = self.runner.prefill_together(requests, n_tokens)
        except Exception as exc:  # noqa: BLE001 — each request still gets its own prefill below
            log.warning("batched prefill of %d requests failed (%s); prefilling them one at a time", len(rows),
                        type(exc).__name__)
            self._counters["prefill_batch_fallbacks"] += 1
            for req, n in rows:
                self._prefill(req, n)
            return
        self._counters["prefill_forwards"] += 1
        self._counters["prefill_batched_rows"] += len(rows)
        for (req, n), row_logits in zip(rows, logits):
            self._prefill(req, n, row_logits)

    def _prefill(self, req: Request, n_tokens: int, logits: torch.Tensor | None = None) -> None:
        """Run a prefill chunk of ``req`` (or take the ``logits`` a batched prefill gave it) and, at the prompt's
        end, sample its first token and move it into the decode batch."""
        try:
            if logits is None:
                logits = self._prefill_chunk(req, n_tokens)
            self.sessions.checkpoint(req)
            self._counters["prefill_tokens"] += n_tokens
            if req.remaining_prefill > 0:
                return  # more chunks next step
            self.scheduler.prefill_done(req)
            token = sample_next_tokens(logits[None], [req.params], [req.generator],
                                       self._seen([req], logits.shape[-1]))[0]
            req.status = Status.RUNNING
            if not self._accept_token(req, token):
                self.batch.add(req, req.cache, req.num_tokens - 1, token)
                req.kv.move(Where.IN_ROW)
                req.slicing.start = len(req.output_ids)
        except torch.OutOfMemoryError:
            self._prefill_out_of_memory(req)
        except Exception as exc:  # noqa: BLE001 — one bad request must not stop the engine
            log.exception("prefill failed for %s", req.request_id)
            self._counters["step_errors"] += 1
            self._finish(req, FinishReason.ERROR, error=f"the model failed on this request ({type(exc).__name__})")

    def _prefill_chunk(self, req: Request, n_tokens: int) -> torch.Tensor:
        """Run ``n_tokens`` more prompt tokens of ``req``, pausing (within this step) at each length where the session
        store keeps a prefix others may share (``SessionStore.share_stop``: conv and sliding-window states exist
        only at the exact length they were taken)."""
        end = req.num_computed + n_tokens
        while True:
            stop = self.sessions.share_stop(req)
            piece = stop - req.num_computed if stop is not None and stop < end else end - req.num_computed
            logits = self.runner.prefill(req, piece)
            self._counters["prefill_forwards"] += 1
            if req.num_computed >= end:
                return logits
            self.sessions.checkpoint(req)

    def _seen(self, requests, vocab: int) -> list | None:
        """What a repetition penalty weighs for each of ``requests`` (None for a row without one; None for all when
        none has one): its prompt's distinct ids below ``vocab`` (the logits' width: an id past it can never be
        chosen), copied to the device once, and its answer's so far."""
        if not any(penalised(r.params) for r in requests):
            return None
        seen = []
        for r in requests:
            if penalised(r.params) and r.seen_prompt is None:
                ids = sorted(i for i in set(r.prompt.token_ids) if i < vocab)
                r.seen_prompt = torch.tensor(ids, dtype=torch.long, device=self.runner.device)
            seen.append((r.seen_prompt, r.output_ids) if penalised(r.params) else None)
        return seen

    def _prefill_out_of_memory(self, req: Request) -> None:
        """Free idle sessions and admit this prompt again next; a second failure fails the request."""
        self._counters["oom_events"] += 1
        freed = self.sessions.evict_all()
        if req.oom_retries >= 1:
            self._finish(req, FinishReason.ERROR, error="the server ran out of memory for this request; "
                                                         "try a smaller image or a shorter conversation")
            return
        log.warning("out of memory in prefill of %s; freed %d session bytes, retrying", req.request_id, freed)
        req.oom_retries += 1
        req.restart_prefill()
        self.scheduler.retry(req)

    def _decode(self) -> None:
        undo = self.batch.undo_point()
        try:
            logits, cache = self.runner.decode(self.batch)
        except torch.OutOfMemoryError:
            self._decode_out_of_memory(undo)
            return
        except Exception as exc:  # noqa: BLE001
            log.exception("decode step failed for %d requests", len(self.batch))
            self._counters["step_errors"] += 1
            for req in list(self.batch.requests):
                self._finish(req, FinishReason.ERROR, error=f"the model failed mid-answer ({type(exc).__name__})")
            self._drop_finished_rows()
            return
        rows = self.batch.requests
        tokens = sample_next_tokens(logits, [r.params for r in rows], [r.generator for r in rows],
                                    self._seen(rows, logits.shape[-1]))
        self._counters["decode_steps"] += 1
        self._counters["decode_rows"] += len(rows)
        self.batch.advance(cache, tokens)
        for req, token in zip(list(rows), tokens):
            self._accept_token(req, token)
        self._drop_finished_rows()

    def _decode_out_of_memory(self, undo) -> None:
        """Roll the batch back, free idle sessions; if that freed nothing, shed the newest half of the batch."""
        self.batch.rollback(undo)
        self._counters["oom_events"] += 1
        if self.sessions.evict_all() == 0:
            shed = self.batch.requests[(len(self.batch) + 1) // 2:] or self.batch.requests
            for req in list(shed):
                self._finish(req, FinishReason.ERROR,
                             error="the server ran out of memory mid-answer; please ask again in a moment")
            self._drop_finished_rows()
        log.warning("out of memory in decode; %d rows remain and retry next step", len(self.batch))

    def _accept_token(self, req: Request, token: int) -> bool:
        """Append a sampled token, stream its text, and finish the request if it should stop. True if finished."""
        now = time.monotonic()
        if req.first_token_time is None:
            req.first_token_time = now
        req.output_ids.append(token)
        self._counters["generated_tokens"] += 1
        if token in self.runner.eos_ids and not req.params.ignore_eos:
            self._finish(req, FinishReason.EOS)
            return True
        req.handle.push_delta(req.detokenizer.add_token(token))
        if req.detokenizer.stopped:
            self._finish(req, FinishReason.STOP)
        elif len(req.output_ids) >= req.params.max_new_tokens or req.num_tokens >= req.max_len:
            self._finish(req, FinishReason.LENGTH)
        return req.status is Status.FINISHED

    def _finish(self, req: Request, reason: FinishReason, error: str | None = None) -> None:
        if req.status is Status.FINISHED:
            return
        if req.status is Status.RUNNING and reason in (FinishReason.EOS, FinishReason.STOP, FinishReason.LENGTH):
            self.sessions.save_turn(req, self.batch)
        if req.status in (Status.WAITING, Status.PREFILLING, Status.PAUSED):
            self.scheduler.remove(req)
        req.status = Status.FINISHED
        req.kv.move(Where.NOWHERE)
        req.scratch = RunnerScratch()
        if reason is not FinishReason.ERROR:
            req.handle.push_delta(req.detokenizer.flush())
        with self._lock:
            self._live.pop(req.request_id, None)
        key = {FinishReason.ERROR: "requests_failed", FinishReason.CANCELLED: "requests_cancelled"}.get(
            reason, "requests_finished")
        self._counters[key] += 1
        req.handle.finish(FinalResult(
            request_id=req.request_id, text=req.detokenizer.text, token_ids=list(req.output_ids),
            finish_reason=reason, stats=req.stats(), error=error,
        ))

    def _drop_finished_rows(self) -> None:
        keep = [i for i, r in enumerate(self.batch.requests) if r.status is not Status.FINISHED]
        self.batch.filter(keep)


def greedy(max_new_tokens: int = 64, **kw) -> SamplingParams:
    """Shorthand used by tests and benchmarks."""
    return SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0, **kw)

