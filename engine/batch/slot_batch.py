"""SlotBatch: the decode batch over a preallocated ``SlotPool`` (a ``DecodeBatch``, engine/batch/decode_batch.py).

The path for families whose row says ``decode_batch="slots"`` (engine/models/families.py): full-attention and LFM2 conv
layers, plain positions.

Row ``i`` of the batch lives in slot ``i``. ``add`` copies a freshly prefilled batch-1 cache into the next free
slot; ``filter`` refills each freed slot with the last row (one row's copy per finished request, instead of
re-concatenating the whole cache every step). A decode step's inputs are built from the row lengths alone:
``position_ids`` are the lengths, and the ``[B, 1, 1, T]`` mask marks positions ``< length + 1`` of each row, so
a short row never reads another row's padding as its own — it only skips the tail positions it does not have.
"""
from __future__ import annotations

import torch

from . import varlen_attention
from ..kv.cache_layers import kv_bytes_per_token
from ..kv.slot_cache import SlotCache, SlotPool
from .varlen_attention import attended_positions, plan_segments


class SlotBatch:
    def __init__(self, pool: SlotPool, device: torch.device):
        self.pool = pool
        self.device = device
        self.cache = SlotCache(pool)
        self.requests: list = []
        self.seq_lens: torch.Tensor | None = None  # [B] tokens in each row's slot
        self.last_tokens: torch.Tensor | None = None  # [B] next input token per row
        self._positions = torch.arange(pool.slot_len, device=device)
        self.static_step = None  # a cuda_graphs.StaticDecode when decode_graphs is on (ModelRunner.decode runs it)
        # Varlen decode attention (engine/batch/varlen_attention.py): the cost of one more attention call in
        # row-positions, or None for one padded call over the longest row.
        self.segment_call_cost: int | None = None
        self.last_attended = 0  # row-positions the last step's attention read (benchmarks report padding with it)

    def __len__(self) -> int:
        return len(self.requests)

    @property
    def padded_len(self) -> int:
        """Positions a step's attention spans: the longest row (the others mask their tail)."""
        return 0 if not self.requests else int(self.seq_lens.max())

    @property
    def max_len(self) -> int:
        """Tokens one row can reach (prompt + output): the slot length."""
        return self.pool.slot_len

    def add(self, request, cache, length: int, last_token: int) -> None:
        """Copy a batch-1 cache holding ``length`` tokens into the next slot; its next input is ``last_token``."""
        slot = len(self.requests)
        assert slot < self.pool.num_slots, "more running rows than slots (max_running)"
        assert length < self.pool.slot_len, "a row longer than its slot (the engine caps max_len at slot_len)"
        self.pool.copy_in(slot, cache, length)
        row_len = torch.tensor([length], device=self.device)
        row_tok = torch.tensor([last_token], device=self.device)
        if self.seq_lens is None or not self.requests:
            self.seq_lens, self.last_tokens = row_len, row_tok
        else:
            self.seq_lens = torch.cat([self.seq_lens, row_len])
            self.last_tokens = torch.cat([self.last_tokens, row_tok])
        self.requests.append(request)

    def filter(self, keep: list[int]) -> None:
        """Keep rows ``keep``. Kept rows above the new size move down into the freed slots below it, so each
        finished request costs at most one row's copy; the batch's row order changes accordingly."""
        if len(keep) == len(self):
            return
        n, keep_set = len(keep), set(keep)
        holes = [i for i in range(n) if i not in keep_set]
        movers = [i for i in sorted(keep) if i >= n]
        lens = self.seq_lens.tolist()
        mapping = list(range(n))  # slot -> the old row that lives there now
        for hole, src in zip(holes, movers):
            self.pool.move(src, hole, lens[src])
            mapping[hole] = src
        idx = torch.tensor(mapping, device=self.device, dtype=torch.long)
        self.requests = [self.requests[i] for i in mapping]
        self.seq_lens, self.last_tokens = self.seq_lens[idx], self.last_tokens[idx]

    def step_inputs(self) -> dict:
        """Model kwargs for one decode step over every row."""
        lens = self.seq_lens.tolist()  # one device read serves the cache's span and the varlen plan
        self.cache.bind_static(len(lens), max(lens) + 1, self.seq_lens[:, None])
        valid = self._positions[None, :self.cache.kv_len] <= self.seq_lens[:, None]  # [B, T]
        inputs = dict(
            input_ids=self.last_tokens[:, None],
            attention_mask=valid[:, None, None, :],
            position_ids=self.seq_lens[:, None],
            cache=self.cache,
            use_cache=True,
        )
        if self.segment_call_cost is None:
            self.last_attended = len(self) * self.cache.kv_len
        else:
            runs = plan_segments([n + 1 for n in lens], self.segment_call_cost)
            inputs["owlet_segments"] = runs
            self.last_attended = attended_positions(runs)
        return inputs

    def advance(self, cache, next_tokens: list[int]) -> None:
        """Record a finished decode step: every row gained one cached token (written in place)."""
        self.seq_lens = self.seq_lens + 1
        self.last_tokens = torch.tensor(next_tokens, device=self.device)

    def snapshot(self, request):
        row = self.requests.index(request)
        return self.pool.snapshot(row, int(self.seq_lens[row]))

    def undo_point(self):
        return self.pool.undo_point(len(self))

    def rollback(self, undo) -> None:
        self.pool.rollback(undo)


_CPU_DEFAULT_POOL_MB = 512


def make_slot_batch(config, runner, max_model_len: int) -> SlotBatch:
    """A ``SlotBatch`` over a pool sized once from the memory budget (``kv_pool_mb``), with the decode step the
    config asks for: varlen attention (eager), or static shapes, captured as CUDA graphs on a CUDA device."""
    per_token = kv_bytes_per_token(runner.text_config, runner.dtype) * config.max_running
    if config.kv_pool_mb is not None:
        budget = int(config.kv_pool_mb * 2**20)
    elif runner.device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(runner.device)
        budget = int(free * 0.5)
    else:
        budget = _CPU_DEFAULT_POOL_MB * 2**20
    slot_len = min(max_model_len, budget // max(per_token, 1))
    if slot_len < min(64, max_model_len):
        raise ValueError(f"the KV pool budget ({budget / 2**20:.2f} MB) holds only {slot_len} tokens per slot for "
                         f"max_running={config.max_running}; raise kv_pool_mb or lower max_running")
    pool = SlotPool(runner.text_config, config.max_running, slot_len, runner.device, runner.dtype)
    batch = SlotBatch(pool, runner.device)
    graphs = config.decode_graphs
    if graphs == "auto":
        graphs = "cuda" if runner.device.type == "cuda" else "off"
    if config.decode_attention == "varlen" and graphs == "off":  # graphs need one static shape
        if varlen_attention.install(runner.model, runner.text_config):
            batch.segment_call_cost = varlen_attention.CALL_COST.get(runner.device.type,
                                                                     varlen_attention.CALL_COST["cuda"])
    if graphs != "off":
        from .cuda_graphs import StaticDecode

        batch.static_step = StaticDecode(runner.model, pool, capture=graphs == "cuda", compile=config.decode_compile)
    elif config.decode_compile:
        raise ValueError("decode_compile compiles the static-shape decode step: set decode_graphs to static or cuda")
    return batch
