"""SessionStore: finished turns' KV caches, kept per conversation so the next turn prefills only what is new.

An entry holds the exact token ids its cache covers, the attention K/V for them, and conv-state checkpoints
(hybrid models such as LFM2). On the next turn the new prompt — the full templated history — is matched
token by token against the entry, and only the part after the verified prefix is prefilled:

- attention-only models (LLaVA/Llama) reuse the longest common prefix: K/V for a prefix is just a slice;
- hybrid models have a conv state with no time axis, valid only at the exact length it was taken. Each entry
  keeps two checkpoints: at the end of the previous prompt and at the end of the previous answer. A follow-up
  normally matches the whole previous turn; when the answer was re-tokenised differently, or the history was
  edited after the previous prompt, the prompt-end checkpoint still saves the image and the older turns; any
  other divergence recomputes from scratch. A wrong prefix is never reused: every reused token was compared.

Entries live in a byte-budgeted LRU. Accounting is the real bytes of the stored tensors. Idle entries may be
parked off the device as int8 or int4 K/V (conv states stay full precision) and are restored on resume.
New conversations share the template head (e.g. ``<|startoftext|><|im_start|>user\n`` or a system prompt),
which is cached once as a prefix entry.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import torch

from . import kv_cache
from .byte_lru import ByteLRU
from .config import EngineConfig
from .kv_quant import StoredTensor, park_kv

log = logging.getLogger("owlet.engine")

_CPU_DEFAULT_BUDGET_MB = 256


@dataclass
class SessionEntry:
    token_ids: list[int]  # exactly the tokens the K/V covers
    kv: dict[int, tuple[StoredTensor, StoredTensor]]
    conv_checkpoints: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # length -> layer -> state
    hybrid: bool = False  # has conv layers: only checkpointed lengths can be restored

    @property
    def nbytes(self) -> int:
        n = sum(k.nbytes + v.nbytes for k, v in self.kv.values())
        return n + sum(s.nbytes for ck in self.conv_checkpoints.values() for s in ck.values())

    def usable_prefix(self, prompt_ids: list[int]) -> int:
        """Tokens of ``prompt_ids`` this entry can serve: verified equal, restorable, and leaving >= 1 to run."""
        limit = min(len(self.token_ids), len(prompt_ids) - 1)
        same = 0
        while same < limit and self.token_ids[same] == prompt_ids[same]:
            same += 1
        if not self.hybrid:
            return same
        return max((n for n in self.conv_checkpoints if n <= same), default=0)


class SessionStore:
    def __init__(self, budget_bytes: int, text_config, device: torch.device, model_dtype: torch.dtype,
                 park_mode: str = "none", group_size: int = 32, enabled: bool = True):
        self.entries = ByteLRU(budget_bytes)
        self.text_config = text_config
        self.device = device
        self.model_dtype = model_dtype
        self.park_mode = park_mode
        self.group_size = group_size
        self.enabled = enabled
        self.counters = dict(session_hits=0, session_misses=0, session_partial_hits=0, prefix_hits=0,
                             reused_tokens=0)

    @classmethod
    def for_runner(cls, config: EngineConfig, runner) -> "SessionStore":
        return cls(cls.default_budget(config, runner), runner.text_config, runner.device, runner.dtype,
                   config.park_mode, config.park_group_size, config.session_cache)

    @staticmethod
    def default_budget(config: EngineConfig, runner) -> int:
        if config.session_budget_mb is not None:
            return int(config.session_budget_mb * 2**20)
        if runner.device.type != "cuda":
            return _CPU_DEFAULT_BUDGET_MB * 2**20
        free, _ = torch.cuda.mem_get_info(runner.device)
        # Keep room for a full decode batch at full context before lending the rest to idle sessions.
        reserve = config.max_running * runner.max_model_len * kv_bytes_per_token(runner.text_config, runner.dtype)
        return max(0, int((free - reserve) * config.session_budget_fraction))

    # -- engine hooks -----------------------------------------------------------
    def restore(self, req) -> None:
        """Before a request's first prefill: load the longest verified cached prefix into ``req.cache``."""
        if not self.enabled:
            return
        entry, source = None, "session"
        if req.session_id is not None:
            entry = self.entries.get(req.session_id)
        reuse = entry.usable_prefix(req.prompt.token_ids) if entry is not None else 0
        if reuse == 0:
            self.counters["session_misses"] += req.session_id is not None
            key, source = self._prefix_key(req.prompt.head_ids), "prefix"
            entry = self.entries.get(key) if key else None
            reuse = entry.usable_prefix(req.prompt.token_ids) if entry is not None else 0
            if reuse == 0:
                return
            self.counters["prefix_hits"] += 1
        elif reuse < len(entry.token_ids):
            self.counters["session_partial_hits"] += 1
        else:
            self.counters["session_hits"] += 1
        req.cache = self._materialise(entry, reuse)
        req.num_computed = req.cached_tokens = reuse
        req.cache_source = source
        self.counters["reused_tokens"] += reuse

    def first_chunk_limit(self, req) -> int | None:
        """If the shared template head is not cached yet, stop the first chunk there so it can be saved."""
        if not self.enabled or req.num_computed or not req.prompt.head_ids:
            return None
        key = self._prefix_key(req.prompt.head_ids)
        return None if key in self.entries else len(req.prompt.head_ids)

    def after_chunk(self, req) -> None:
        """Save the template head once it has been prefilled (see ``first_chunk_limit``)."""
        head = req.prompt.head_ids
        if self.enabled and head and req.num_computed == len(head) and not req.cached_tokens:
            key = self._prefix_key(head)
            if key not in self.entries:
                snap = kv_cache.snapshot_row(req.cache, 0, len(head))
                self._put(key, list(head), snap, {len(head): snap.conv} if snap.conv else {})

    def checkpoint_prompt(self, req) -> None:
        """At the end of a prompt's prefill, keep the conv states: they are the only way back to this point."""
        if self.enabled and req.session_id is not None:
            snap = kv_cache.snapshot_row(req.cache, 0, req.prompt_len)
            req.prompt_conv = snap.conv or None

    def park(self, req, batch) -> None:
        """A turn finished normally: keep its cache (prompt + answer) for the conversation's next turn."""
        if not self.enabled or req.session_id is None:
            return
        length = req.num_tokens - 1  # the last sampled token was never fed to the model
        if req.cache is not None:  # finished on its first token, never joined the batch
            snap = kv_cache.snapshot_row(req.cache, 0, length)
        else:
            row = batch.requests.index(req)
            assert int(batch.seq_lens[row]) == length, "batch row length disagrees with the request's tokens"
            snap = batch.snapshot(req)
        checkpoints = {}
        if snap.conv:
            checkpoints[length] = snap.conv
            if getattr(req, "prompt_conv", None) is not None:
                checkpoints[req.prompt_len] = req.prompt_conv
        self._put(req.session_id, req.all_token_ids[:length], snap, checkpoints)

    def drop(self, session_id: str) -> None:
        self.entries.pop(session_id)

    def evict_all(self) -> int:
        """Free every entry (out-of-memory recovery). Returns bytes freed."""
        freed = self.entries.bytes_held
        for key in self.entries.keys():
            self.entries.pop(key)
        return freed

    def stats(self) -> dict:
        e = self.entries
        return dict(sessions=[k for k in e.keys() if not k.startswith("prefix:")], session_bytes=e.bytes_held,
                    session_budget_bytes=e.budget, session_evictions=e.evictions, park_mode=self.park_mode,
                    **self.counters)

    # -- internals --------------------------------------------------------------
    def _put(self, key: str, token_ids: list[int], snap: kv_cache.CacheSnapshot, checkpoints: dict) -> None:
        where = self.device if self.park_mode == "none" else "cpu"
        # Keys carry outliers in fixed channels, so they are grouped per channel along time (KIVI-style);
        # values are grouped along each token's head_dim.
        kv = {i: (park_kv(k, self.park_mode, self.group_size, where, per_channel=self.park_mode != "none"),
                  park_kv(v, self.park_mode, self.group_size, where)) for i, (k, v) in snap.kv.items()}
        entry = SessionEntry(token_ids, kv, checkpoints, hybrid=bool(snap.conv))
        for evicted_key, _ in self.entries.put(key, entry, entry.nbytes):
            log.debug("evicted session %s", evicted_key)

    def _materialise(self, entry: SessionEntry, length: int):
        kv = {i: (k.dequantize(self.device, self.model_dtype)[:, :, :length],
                  v.dequantize(self.device, self.model_dtype)[:, :, :length]) for i, (k, v) in entry.kv.items()}
        conv = {i: s.to(self.device) for i, s in entry.conv_checkpoints.get(length, {}).items()}
        return kv_cache.cache_from_snapshot(kv_cache.CacheSnapshot(kv, conv, length), self.text_config)

    @staticmethod
    def _prefix_key(head_ids) -> str | None:
        if not head_ids:
            return None
        return "prefix:" + hashlib.sha256(str(list(head_ids)).encode()).hexdigest()[:16]


def kv_bytes_per_token(text_config, dtype: torch.dtype) -> int:
    """Attention K/V bytes one token occupies across all layers (conv layers hold no per-token state)."""
    layer_types = getattr(text_config, "layer_types", None) or ["full_attention"] * text_config.num_hidden_layers
    n_attn = sum(1 for t in layer_types if t != "conv")
    heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return 2 * n_attn * heads * head_dim * torch.tensor([], dtype=dtype).element_size()
