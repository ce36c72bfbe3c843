"""OwlSessionStore: the engine's SessionStore, whose entries also hold the conversation's image K/V.

A finished turn keeps, besides the self-attention cache, each image's cross-attention keys/values for every hyper
layer, in the same entry: one byte count, one LRU slot, the same int8/int4 parking (keys grouped per channel,
values per token, as for the self-attention K/V). When the next turn restores the entry, the runner adopts those
K/V for every image of the new prompt with the same content at the same position, so the follow-up neither runs
the vision tower nor projects the image again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ...kv.kv_quant import StoredTensor, park_kv
from ...kv.session_store import SessionEntry, SessionStore


@dataclass
class ParkedImage:
    sha256: str
    start: int
    kv: dict[int, tuple[StoredTensor, StoredTensor]]  # hyper layer -> parked (keys, values), [1, H, Lv, D]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv.values())


@dataclass
class OwlSessionEntry(SessionEntry):
    images: list[ParkedImage] = field(default_factory=list)

    def tensors(self):
        """The self-attention entry's tensors, then every image's hyper-layer K/V (one byte count, one LRU slot)."""
        yield from super().tensors()
        for image in self.images:
            for k, v in image.kv.values():
                yield from (k, v)


class OwlSessionStore(SessionStore):
    runner = None
    keeps_disk_tier = False  # engine.kv.entry_file does not write image K/V: a follow-up needs them with the prefix

    @classmethod
    def for_runner(cls, config, runner) -> "OwlSessionStore":
        store = super().for_runner(config, runner)
        store.runner = runner
        return store

    def save_turn(self, req, batch) -> None:
        super().save_turn(req, batch)
        row = self.runner.row_images(req) if self.runner is not None else None
        if not self.enabled or req.session_id is None or row is None or not row.images:
            return
        entry = self.entries.pop(req.session_id)
        if entry is None:  # larger than the whole budget: nothing was kept
            return
        where = self.device if self.park_mode == "none" else "cpu"
        per_channel = self.park_mode != "none"
        images = [ParkedImage(im.sha256, im.start, {
            layer: (park_kv(k[None], self.park_mode, self.group_size, where, per_channel=per_channel),
                    park_kv(v[None], self.park_mode, self.group_size, where))
            for layer, (k, v) in im.kv.items()}) for im in row.images]
        full = OwlSessionEntry(entry.token_ids, entry.kv, entry.conv_checkpoints, entry.hybrid, entry.group,
                               images=images)
        self._store(req.session_id, full)

    def restore(self, req) -> None:
        super().restore(req)
        if req.cache_source != "session" or self.runner is None:
            return
        entry = self.entries.get(req.session_id)
        if not isinstance(entry, OwlSessionEntry) or not entry.images:  # a turn without images keeps a plain entry
            return
        self.runner.adopt_session_images(req, {
            (im.sha256, im.start): {layer: (k.dequantize(self.device, self.model_dtype)[0],
                                            v.dequantize(self.device, self.model_dtype)[0])
                                    for layer, (k, v) in im.kv.items()}
            for im in entry.images})
