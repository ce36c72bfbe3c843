"""What the engine hands back: finish reasons, per-request stats and the final result.

These are plain data so that the worker can serialise them onto a Redis Stream as JSON.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class FinishReason(str, Enum):
    EOS = "eos"
    STOP = "stop"  # a stop string matched
    LENGTH = "length"  # max_new_tokens or the model's context reached
    CANCELLED = "cancelled"
    DEADLINE = "deadline"
    ERROR = "error"


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from the session cache, not recomputed
    generated_tokens: int = 0
    queue_s: float = 0.0  # add_request -> prefill start
    ttft_s: float | None = None  # add_request -> first token
    decode_tokens_per_s: float | None = None  # after the first token
    image_cache_hits: int = 0
    # "session" (this conversation's cache), "disk" (the same, read back from the disk tier), "prefix" (shared
    # template head), None
    cache_source: str | None = None
    pauses: int = 0  # times the answer gave its decode row to another group's answer (time slicing)


@dataclass
class FinalResult:
    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    stats: RequestStats = field(default_factory=RequestStats)
    error: str | None = None  # set when finish_reason is ERROR (or DEADLINE), for the user
