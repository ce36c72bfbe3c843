"""Request: one chat turn inside the engine — its prompt, counters, cache and status.

State is plain counters; everything derivable is a property. Only the engine thread mutates a Request after
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
    PAUSED = "paused"  # left the decode batch for another group's answer (time slicing); its cache is in `parked`
    FINISHED = "finished"


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
    cached_tokens: int = 0  # of those, tokens that came from the session cache
    image_cache_hits: int = 0
    cache_source: str | None = None
    cache: object = None  # private DynamicCache (batch 1) while prefilling
    prompt_conv: dict | None = None  # conv states / sliding windows at the prompt's end (session checkpoint)
    embeds: object = None  # input embeddings of the uncached prompt part, built once at prefill start
    embeds_offset: int = 0  # prompt position of embeds[0]
    extra: dict | None = None  # per-token model inputs beyond embeddings, built with embeds (see ModelRunner)
    positions: object = None  # model-defined position ids of the whole prompt (M-RoPE: [3, T]); None = linear
    position_delta: int = 0  # decode position minus cache length (M-RoPE rows after images), kept per row
    output_ids: list[int] = field(default_factory=list)
    parked: object = None  # the row's exact cache (kv_cache.CacheSnapshot) while PAUSED
    slice_start: int = 0  # len(output_ids) when the request last joined the decode batch
    pauses: int = 0  # times time slicing paused it
    overtaken: int = 0  # not-yet-started answers admitted ahead of it while it was paused (time_slicing)
    generator: object = None  # torch.Generator for sampled requests
    oom_retries: int = 0
    prefill_start: float | None = None
    first_token_time: float | None = None

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
        return len(self.output_ids) - self.slice_start

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
            pauses=self.pauses,
        )
