"""Request: one chat turn inside the engine — its prompt, counters, cache and status.

State is plain counters; everything derivable is a property. What one component keeps for a request is grouped
in one field it owns: where the KV cache is (``RequestCache``), the model runner's scratch (``RunnerScratch``),
time slicing's bookkeeping (``TimeSlice``). Only the engine thread mutates a Request after
``add_request`` returns.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from .detokenizer import IncrementalDetokenizer
from .handle import RequestHandle
from .outputs import RequestStats
from .prompt import Prompt
from .sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"  # queued, nothing computed yet
    PREFILLING = "prefilling"  # part of the prompt is in its private cache (chunked prefill)
    RUNNING = "running"  # in the decode batch
    PAUSED = "paused"  # left the decode batch for another group's answer (time slicing); its cache is parked
    FINISHED = "finished"


class Where(enum.Enum):
    """Where a request's KV cache is."""
    NOWHERE = "nowhere"  # nothing computed yet (or dropped: a retry, the end)
    PRIVATE = "private"  # its own batch-1 cache (a DynamicCache) while its prompt is prefilled
    IN_ROW = "in_row"  # a row of the decode batch holds it
    PARKED = "parked"  # the row's exact cache (kv_cache.CacheSnapshot) in host memory while PAUSED


@dataclass
class RequestCache:
    """A request's KV cache: where it is (``where``), the cache itself when the request holds it (``data``: the
    private cache or the parked snapshot; None while a row holds it), and the session checkpoint taken at the
    prompt's end, which goes with it wherever it is."""
    where: Where = Where.NOWHERE
    data: object = None
    prompt_conv: dict | None = None  # conv states / sliding windows at the prompt's end (SessionStore.save_turn)

    def move(self, where: Where, data: object = None) -> None:
        assert (data is not None) == (where in (Where.PRIVATE, Where.PARKED)), f"{where} with data {type(data)}"
        self.where, self.data = where, data


@dataclass(frozen=True)
class CacheHit:
    """The prefix a request reused at admission: its length in tokens, and which cache gave it."""
    tokens: int
    source: str  # "session" (its conversation's earlier turn), "disk" (that turn read back from the disk tier) or
    # "prefix" (the shared template head)


@dataclass
class RunnerScratch:
    """What the model runner builds for a request and keeps with it (``ModelRunner``; the engine never reads it).
    ``embeds`` and ``extra`` live while the prompt is prefilled; ``positions`` and ``position_delta`` while it
    decodes too (a row decodes at its cache length plus the delta)."""
    embeds: object = None  # input embeddings of the uncached prompt part, built once at prefill start
    embeds_offset: int = 0  # prompt position of embeds[0]
    extra: dict | None = None  # per-token model inputs beyond embeddings, built with embeds
    positions: object = None  # model-defined position ids of the whole prompt (M-RoPE: [3, T]); None = linear
    position_delta: int = 0  # decode position minus cache length (M-RoPE rows after images), kept per row


@dataclass
class TimeSlice:
    """Time slicing's bookkeeping of one answer (``engine.time_slicing``)."""
    start: int = 0  # len(output_ids) when the request last joined the decode batch
    pauses: int = 0  # times time slicing paused it
    overtaken: int = 0  # not-yet-started answers admitted ahead of it while it was paused


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: Prompt
    params: SamplingParams
    handle: RequestHandle
    detokenizer: IncrementalDetokenizer
    session_id: str | None = None
    group: str | None = None  # whose conversation, for the session cache's per-group share
    deadline: float | None = None  # time.monotonic() value
    max_len: int = 0  # hard cap on prompt + output tokens (the model's context)
    arrival: float = field(default_factory=time.monotonic)
    status: Status = Status.WAITING
    num_computed: int = 0  # prompt tokens already in the cache (reused or prefilled)
    hit: CacheHit | None = None  # the prefix reused from a cache at admission, if any
    image_cache_hits: int = 0
    kv: RequestCache = field(default_factory=RequestCache)
    scratch: RunnerScratch = field(default_factory=RunnerScratch)
    output_ids: list[int] = field(default_factory=list)
    slicing: TimeSlice = field(default_factory=TimeSlice)
    generator: object = None  # torch.Generator for sampled requests
    # its prompt's distinct ids on the device, once its repetition penalty needed them (engine.sampler)
    seen_prompt: object = None
    oom_retries: int = 0
    prefill_start: float | None = None
    first_token_time: float | None = None

    @property
    def cache(self):
        """Its private cache while its prompt is prefilled; None anywhere else."""
        return self.kv.data if self.kv.where is Where.PRIVATE else None

    @cache.setter
    def cache(self, cache) -> None:
        self.kv.move(Where.NOWHERE if cache is None else Where.PRIVATE, cache)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens that came from a cache at admission."""
        return 0 if self.hit is None else self.hit.tokens

    @property
    def cache_source(self) -> str | None:
        return None if self.hit is None else self.hit.source

    def forget_computed(self) -> None:
        """Drop what was computed or reused of the prompt: it is prefilled from its start."""
        self.kv.move(Where.NOWHERE)
        self.num_computed, self.hit = 0, None

    def restart_prefill(self) -> None:
        """Back to an admitted prompt with nothing computed, no runner scratch and no prefill start: it waits to be
        prefilled again (the out-of-memory retry)."""
        self.forget_computed()
        self.scratch, self.prefill_start = RunnerScratch(), None

    @property
    def prompt_len(self) -> int:
        return len(self.prompt.token_ids)

    @property
    def remaining_prefill(self) -> int:
        return self.prompt_len - self.num_computed

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + len(self.output_ids)

    @property
    def slice_tokens(self) -> int:
        """Tokens decoded since the request last joined the batch: its use of the current time slice."""
        return len(self.output_ids) - self.slicing.start

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt.token_ids + self.output_ids

    def stats(self) -> RequestStats:
        now = time.monotonic()
        ttft = None if self.first_token_time is None else self.first_token_time - self.arrival
        tps = None
        if self.first_token_time is not None and len(self.output_ids) > 1:
            tps = (len(self.output_ids) - 1) / max(now - self.first_token_time, 1e-9)
        return RequestStats(
            prompt_tokens=self.prompt_len,
            cached_tokens=self.cached_tokens,
            generated_tokens=len(self.output_ids),
            queue_s=(self.prefill_start or now) - self.arrival,
            ttft_s=ttft,
            decode_tokens_per_s=tps,
            image_cache_hits=self.image_cache_hits,
            cache_source=self.cache_source,
            pauses=self.slicing.pauses,
        )
