"""Per-request sampling parameters, validated on construction.

Invalid values raise ``ValueError`` with a message a user can act on; the engine turns
that into a rejected request, never into a failed step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field


# The seeds ``torch.Generator.manual_seed`` takes (a negative one wraps to 2**64 + seed); beyond them it raises
# "Overflow when unpacking long long", which said nothing to the client who sent the seed.
SEED_MIN, SEED_MAX = -2**63, 2**64 - 1
MAX_REPETITION_PENALTY = 10.0  # past this every token already said is all but ruled out: no answer is readable


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False  # keep generating past EOS (benchmarks that need a fixed amount of work)
    # Every token already in the conversation made less likely, as transformers' repetition_penalty does (greedy rows
    # too). None: the checkpoint's own default (its generation_config.json; 1.0, none, where it sets none).
    repetition_penalty: float | None = None

    def __post_init__(self):
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        if not isinstance(self.max_new_tokens, int) or isinstance(self.max_new_tokens, bool) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not (0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must be between 0 and 10, got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ValueError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an integer or None, got {self.seed!r}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be an integer from {SEED_MIN} to {SEED_MAX}, got {self.seed}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError("ignore_eos must be true or false")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError("stop strings must be non-empty strings")
        penalty = self.repetition_penalty
        if penalty is not None and (not isinstance(penalty, (int, float)) or isinstance(penalty, bool)
                                    or not math.isfinite(penalty) or not 0 < penalty <= MAX_REPETITION_PENALTY):
            raise ValueError(f"repetition_penalty must be a number above 0 and at most {MAX_REPETITION_PENALTY:g}, "
                             f"got {penalty!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @classmethod
    def from_dict(cls, data: dict | None) -> "SamplingParams":
        """Build from a JSON-like dict (job payloads); unknown keys are an error, not silently dropped."""
        data = dict(data or {})
        known = set(cls.__dataclass_fields__)
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown sampling parameters: {sorted(unknown)}")
        return cls(**data)
