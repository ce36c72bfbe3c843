"""SessionStore: finished turns' KV caches, kept per conversation so the next turn prefills only what is new.

An entry holds the exact token ids its cache covers, the attention K/V for them, and conv-state checkpoints
(hybrid models such as LFM2). On the next turn the new prompt — the full templated history — is matched
token by token against the entry, and only the part after the verified prefix is prefilled:

- attention-only models (LLaVA/Llama) reuse the longest common prefix: K/V for a prefix is just a slice;
- hybrid models have a conv state with no time axis, valid only at the exact length it was taken (so is a
  sliding-window layer's K/V once the window has dropped early tokens: Gemma 3, Mistral). Each entry
  keeps two checkpoints: at the end of the previous prompt and at the end of the previous answer. A follow-up
  normally matches the whole previous turn; when the answer was re-tokenised differently, or the history was
  edited after the previous prompt, the prompt-end checkpoint still saves the image and the older turns; any
  other divergence recomputes from scratch. A wrong prefix is never reused: every reused token was compared.

Entries live in a byte-budgeted LRU. Accounting is the real bytes of the stored tensors. One client group (the
address or login the worker names for the request) holds at most ``group_share`` of a pool: past it, its own
oldest entries go first, so one client's many conversations cannot flush everyone else's caches. Idle entries may
be parked off the device as int8 or int4 K/V, with their conv states (kept in full precision), in host memory, and
are restored on resume. Device bytes and host bytes are accounted separately, each under its own budget.
With a disk tier (``engine.kv.disk_tier``, ``EngineConfig.disk_cache_dir``) every entry kept is also written to a
file, so it outlives host memory and the worker: a lookup that misses memory reads the file back (cache source
"disk") when that is faster than prefilling it.
New conversations share the template head (e.g. ``<|startoftext|><|im_start|>user\n`` or a system prompt),
which is cached once as a prefix entry, and longer prefixes another conversation already computed (the same
picture, the same question), found by content: engine/kv/prefix_index.py.
"""
from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field

import torch

from . import disk_tier, kv_cache
from .byte_lru import ByteLRU
from .cache_layers import cache_layer_kinds, kv_bytes_per_token
from ..config import EngineConfig
from .kv_quant import StoredTensor, park_kv
from ..request import CacheHit
from .prefix_index import PrefixIndex

log = logging.getLogger("owlet.engine")

_CPU_DEFAULT_BUDGET_MB = 256


@dataclass
class SessionEntry:
    token_ids: list[int]  # exactly the tokens the K/V covers
    kv: dict[int, tuple[StoredTensor, StoredTensor]]
    conv_checkpoints: dict[int, dict[int, torch.Tensor]] = field(default_factory=dict)  # length -> layer -> state
    hybrid: bool = False  # conv layers or cropped sliding-window layers: only checkpointed lengths restore
    group: str | None = None  # whose conversation (its share is capped); None: shared, e.g. the template head

    def tensors(self):
        """Every stored tensor: K/V (possibly quantised) and conv checkpoints."""
        for k, v in self.kv.values():
            yield from (k, v)
        for checkpoint in self.conv_checkpoints.values():
            yield from checkpoint.values()

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors())

    def nbytes_by_pool(self, device: torch.device) -> dict[str, int]:
        """Real bytes on the compute ``device`` ("device") and parked elsewhere, i.e. in host memory ("host")."""
        pools = {"device": 0, "host": 0}
        for t in self.tensors():
            pools["device" if t.device.type == device.type else "host"] += t.nbytes
        return pools

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
    keeps_disk_tier = True  # its entries are plain SessionEntry fields, which engine.kv.entry_file writes

    def __init__(self, budget_bytes: int, text_config, device: torch.device, model_dtype: torch.dtype,
                 park_mode: str = "none", group_size: int = 32, enabled: bool = True, host_budget_bytes: int = 0,
                 group_share: float = 1.0, image_token_id: int | None = None,
                 disk: disk_tier.DiskTier | None = None):
        # Two byte pools, each with its own budget: entries on the compute device, and entries parked in host
        # memory (int8/int4 on an accelerator). On a CPU engine the device is host memory: one pool is used.
        self.entries = ByteLRU({"device": budget_bytes, "host": host_budget_bytes})
        self.text_config = text_config
        self.device = device
        self.model_dtype = model_dtype
        self.park_mode = park_mode
        self.group_size = group_size
        self.enabled = enabled
        self.group_share = group_share
        self.disk = disk  # files behind both pools (write-through), or None
        # Prefixes shared across conversations (None image token: the runner cannot place images; never shared).
        self.prefixes = PrefixIndex(image_token_id, exact_lengths=bool(cache_layer_kinds(text_config) - {"full"}))
        self.counters = dict(session_hits=0, session_misses=0, session_partial_hits=0, prefix_hits=0,
                             shared_prefix_hits=0, shared_prefixes_kept=0,
                             reused_tokens=0, session_group_evictions=0, session_group_refusals=0)

    @classmethod
    def for_runner(cls, config: EngineConfig, runner) -> "SessionStore":
        disk = disk_tier.open_for(config, runner) if config.session_cache and cls.keeps_disk_tier else None
        return cls(cls.default_budget(config, runner), runner.text_config, runner.device, runner.dtype,
                   config.park_mode, config.park_group_size, config.session_cache,
                   host_budget_bytes=int(config.session_host_budget_mb * 2**20),
                   group_share=config.session_group_share,
                   image_token_id=runner.image_token_id if config.shared_prefixes else None, disk=disk)

    @staticmethod
    def default_budget(config: EngineConfig, runner) -> int:
        """The device pool's budget: explicit, 256 MB on CPU, or a share of free accelerator memory."""
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
        """At admission (the scheduler calls this before it budgets prefill tokens): load the longest verified
        cached prefix into ``req.cache`` and count it in ``req.num_computed``.

        Never raises: a cache that cannot be restored (e.g. out of device memory) is a miss, and the prompt is
        recomputed, which gives the same tokens.
        """
        if not self.enabled:
            return
        try:
            self._restore(req)
            return
        except torch.OutOfMemoryError:
            log.warning("out of memory restoring a cached prefix for %s; freed %d session bytes, recomputing",
                        req.request_id, self.evict_all())
        except Exception:  # noqa: BLE001 — a broken cache entry must not fail the request
            log.exception("could not restore a cached prefix for %s; recomputing it", req.request_id)
        req.forget_computed()

    def _restore(self, req) -> None:
        entry, source = None, "session"
        if req.session_id is not None:
            entry, source = self._lookup(req.session_id, source)
        reuse = entry.usable_prefix(req.prompt.token_ids) if entry is not None else 0
        if reuse == 0:
            self.counters["session_misses"] += req.session_id is not None
            key = self._prefix_key(req.prompt.head_ids)
            entry, source = self._lookup(key, "prefix") if key else (None, "prefix")
            reuse = entry.usable_prefix(req.prompt.token_ids) if entry is not None else 0
            outcome = "prefix_hits"
            shared, usable = self.prefixes.lookup(self.entries, req)
            if usable > reuse:
                entry, reuse, outcome = shared, usable, "shared_prefix_hits"
                if entry.group is not None and entry.group != req.group:
                    entry.group = None  # a second group uses it: shared, out of every group's share, still LRU
            if reuse == 0:
                return
        else:
            outcome = "session_partial_hits" if reuse < len(entry.token_ids) else "session_hits"
        req.cache = self._materialise(entry, reuse)
        req.num_computed, req.hit = reuse, CacheHit(reuse, source)
        self.counters[outcome] += 1
        self.counters["reused_tokens"] += reuse

    def needs_head(self, head_ids) -> bool:
        """True while the shared template head is not cached: the scheduler then ends a first chunk there."""
        return self.enabled and bool(head_ids) and self._prefix_key(head_ids) not in self.entries

    def share_stop(self, req) -> int | None:
        """Where a prefill chunk of ``req`` should pause so that a prefix others may share can be kept at its exact
        length (engine/kv/prefix_index.py); None: nowhere."""
        return self.prefixes.chunk_stop(self.entries, req) if self.enabled else None

    def checkpoint(self, req) -> None:
        """After each prefill chunk: save what can only be taken at this exact length.

        - the template head, when this chunk ended there and it is not cached yet (the scheduler stops a first
          chunk at the head for this);
        - the conv states at the end of the prompt, kept on the request for ``save_turn``: on hybrid models they
          are the only way back to this point.
        """
        if not self.enabled:
            return
        head = req.prompt.head_ids
        if head and req.num_computed == len(head) and not req.cached_tokens:
            key = self._prefix_key(head)
            if key not in self.entries:
                snap = kv_cache.snapshot_row(req.cache, 0, len(head))
                exact = snap.conv or snap.cropped
                self._put(key, list(head), snap, {len(head): kv_cache.exact_states(snap)} if exact else {})
        if req.remaining_prefill == 0 and req.session_id is not None:
            snap = kv_cache.snapshot_row(req.cache, 0, req.prompt_len)
            req.kv.prompt_conv = kv_cache.exact_states(snap) or None
        self._keep_shared_prefix(req)

    def _keep_shared_prefix(self, req) -> None:
        """At a share point of a prompt not restored from its own session (engine/kv/prefix_index.py): keep the states
        valid only here; at the last one, keep the prefix as an entry charged to the request's group."""
        if req.cache_source in ("session", "disk"):  # its own conversation's cache
            return
        _, points, keys = self.prefixes.plan(req)
        if not self.prefixes.exact_lengths:  # full attention: the prompt's K/V sliced at its last share point
            if req.remaining_prefill or not points or self.prefixes.held(self.entries, keys[-1]):
                return
            snap = kv_cache.prefix_of(kv_cache.snapshot_row(req.cache, 0, req.prompt_len), points[-1])
            return self._keep_prefix_entry(req, snap, {}, keys)
        if req.num_computed not in points or self.prefixes.held(self.entries, keys[points.index(req.num_computed)]):
            return
        snap = kv_cache.snapshot_row(req.cache, 0, req.num_computed)
        states = kv_cache.exact_states(snap)
        if req.num_computed != points[-1]:
            if states:
                self.prefixes.remember_states(req, states)
            return
        self._keep_prefix_entry(req, snap, {**self.prefixes.states(req), req.num_computed: states}, keys)

    def _keep_prefix_entry(self, req, snap: kv_cache.CacheSnapshot, checkpoints: dict, keys: list[str]) -> None:
        key = self.prefixes.entry_key(keys[-1])
        self._put(key, req.prompt.token_ids[:snap.length], snap, checkpoints, group=req.group)
        if key in self.entries:
            self.counters["shared_prefixes_kept"] += 1
            self.prefixes.register(self.entries, key, keys)
            self.prefixes.prune(self.entries)

    def save_turn(self, req, batch) -> None:
        """A turn finished normally: keep its cache (prompt + answer) for the conversation's next turn."""
        if not self.enabled or req.session_id is None:
            return
        length = req.num_tokens - 1  # the last sampled token was never fed to the model
        if req.cache is not None:  # finished on its first token, never joined the batch
            snap = kv_cache.snapshot_row(req.cache, 0, length)
        else:
            snap = batch.snapshot(req)
        assert snap.length == length, f"cached length {snap.length} disagrees with the request's {length} tokens"
        checkpoints = {}
        if snap.conv or snap.cropped:
            checkpoints[length] = kv_cache.exact_states(snap)
            if req.kv.prompt_conv is not None:
                checkpoints[req.prompt_len] = req.kv.prompt_conv
        if self.disk is not None and req.prefill_start is not None and req.first_token_time is not None:
            self.disk.note_prefill(req.prompt_len - req.cached_tokens, req.first_token_time - req.prefill_start)
        self._put(req.session_id, req.all_token_ids[:length], snap, checkpoints, group=req.group)

    def evict_all(self) -> int:
        """Free every entry (out-of-memory recovery). Returns bytes freed."""
        freed = self.entries.bytes_held
        for key in self.entries.keys():
            self.entries.pop(key)
        return freed

    def stats(self) -> dict:
        e = self.entries
        return dict(sessions=[k for k in e.keys() if not k.startswith("prefix:")], session_bytes=e.bytes_held,
                    session_device_bytes=e.held["device"], session_host_bytes=e.held["host"],
                    session_budget_bytes=e.budgets["device"], session_host_budget_bytes=e.budgets["host"],
                    session_evictions=e.evictions, park_mode=self.park_mode, **self.counters,
                    **(self.disk_stats() if self.disk is not None else {}))

    def disk_stats(self) -> dict:
        """The disk tier's figures, and the conversations it holds (a restarted worker announces them)."""
        return dict(disk_sessions=[k for k in self.disk.keys() if not k.startswith("prefix:")], **self.disk.stats())

    def close(self) -> None:
        """The engine stops: finish writing the disk tier's files and let its folder go."""
        if self.disk is not None:
            self.disk.close()

    # -- internals --------------------------------------------------------------
    def _put(self, key: str, token_ids: list[int], snap: kv_cache.CacheSnapshot, checkpoints: dict,
             group: str | None = None) -> None:
        # Parked (int8/int4) entries live in host memory, conv checkpoints included (kept in full precision).
        where = self.device if self.park_mode == "none" else torch.device("cpu")
        # Keys carry outliers in fixed channels, so they are grouped per channel along time (KIVI-style);
        # values are grouped along each token's head_dim.
        # Cropped sliding windows can only be restored whole, at a checkpointed length: they live there alone.
        layers = {i: kv for i, kv in snap.kv.items() if not (snap.cropped and i in snap.sliding)}
        kv = {i: (park_kv(k, self.park_mode, self.group_size, where, per_channel=self.park_mode != "none"),
                  park_kv(v, self.park_mode, self.group_size, where)) for i, (k, v) in layers.items()}
        checkpoints = {n: {i: s.to(where) for i, s in states.items()} for n, states in checkpoints.items()}
        entry = SessionEntry(token_ids, kv, checkpoints, hybrid=bool(snap.conv) or snap.cropped, group=group)
        self._store(key, entry)
        if self.disk is not None:
            self.disk.put(key, entry)

    def _lookup(self, key: str, source: str) -> tuple[SessionEntry | None, str]:
        """``key``'s entry from memory, else from the disk tier (then kept in memory again; a conversation's own
        entry read from disk has source "disk", the shared template head stays "prefix")."""
        entry = self.entries.get(key)
        if entry is not None or self.disk is None:
            return entry, source
        fields = self.disk.get(key)
        if fields is None:
            return None, source
        entry = SessionEntry(**fields)
        self._store(key, entry)
        return entry, "disk" if source == "session" else source

    def _store(self, key: str, entry: SessionEntry) -> None:
        """Keep ``entry`` under ``key`` (replacing that key's entry), within its group's share of each pool."""
        sizes = entry.nbytes_by_pool(self.device)
        self.entries.pop(key)  # a conversation's new entry replaces its old one: those bytes are its group's again
        if entry.group is not None and self.group_share < 1.0 and not self._make_room(entry.group, sizes):
            return
        for evicted_key, _ in self.entries.put(key, entry, sizes):
            log.debug("evicted session %s", evicted_key)

    def _make_room(self, group: str, sizes: dict[str, int]) -> bool:
        """Evict ``group``'s own least recently used entries until ``sizes`` more bytes fit in its share of every
        pool. False, evicting nothing, when the entry alone is larger than the share: it is not kept."""
        caps = {pool: int(self.group_share * budget) for pool, budget in self.entries.budgets.items()}
        if any(n > caps[pool] for pool, n in sizes.items()):
            self.counters["session_group_refusals"] += 1
            return False
        own = [(key, held) for key, entry, held in self.entries.items() if entry.group == group]  # oldest first
        total = {pool: sizes.get(pool, 0) + sum(held.get(pool, 0) for _, held in own) for pool in caps}
        for key, held in own:
            if all(total[pool] <= caps[pool] for pool in caps):
                break
            self.entries.pop(key)
            self.counters["session_group_evictions"] += 1
            for pool, n in held.items():
                total[pool] -= n
        return True

    def _materialise(self, entry: SessionEntry, length: int):
        kv = {i: (k.dequantize(self.device, self.model_dtype), v.dequantize(self.device, self.model_dtype))
              for i, (k, v) in entry.kv.items()}
        conv = {i: s.to(self.device) for i, s in entry.conv_checkpoints.get(length, {}).items()}
        snap = kv_cache.CacheSnapshot(kv, {}, len(entry.token_ids))
        return kv_cache.cache_from_snapshot(snap, self.text_config, upto=length, conv=conv)

    @staticmethod
    def _prefix_key(head_ids) -> str | None:
        if not head_ids:
            return None
        return "prefix:" + hashlib.sha256(str(list(head_ids)).encode()).hexdigest()[:16]

