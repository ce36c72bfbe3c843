"""OwlRunner: mPLUG-Owl3 behind the ModelRunner interface the engine calls (prefill one request in chunks, one
batched decode step), so LLMEngine's scheduler, decode batch and session store serve it unchanged.

What differs from the Hugging Face path: images are not slots in the token sequence. Each request keeps, per image
and per hyper layer, the image's cross-attention keys/values (``RowImages``), computed once at its first prefill
chunk, or adopted from the conversation's session entry (then the image is neither encoded nor projected again).
The self-attention cache is an ordinary ``DynamicCache``, so DynamicBatch pads, merges and filters it like any
other; the per-row image K/V follow the batch's rows: filtered when rows leave, appended when rows join.
"""
from __future__ import annotations

import logging
import weakref
from dataclasses import dataclass, field

import torch
from transformers import AutoTokenizer, DynamicCache

from ..generation_defaults import folder_generation_config, repetition_penalty
from ...kv.byte_lru import ByteLRU
from ...config import EngineConfig
from ..families import by_architecture
from ..model_runner import resolve_device, resolve_dtype, shape_free_attention
from .config import ARCHITECTURE
from .model import ImageKV
from .processor import OwlProcessor
from .session import OwlSessionStore
from .weights import load_model, read_config

log = logging.getLogger("owlet.engine")


@dataclass
class PlacedImage:
    """One crop of an image of a request (for the model each crop is an image): ``<picture sha256>/<crop>``, its
    ``<|image|>`` token's position, and per hyper layer its cross-attention keys/values
    [kv_heads, tokens_per_crop, head_dim] (keys already MI-Rope rotated)."""
    sha256: str
    start: int
    kv: dict[int, tuple[torch.Tensor, torch.Tensor]]

    @property
    def nbytes(self) -> int:
        return sum(k.nbytes + v.nbytes for k, v in self.kv.values())


@dataclass
class RowImages:
    images: list[PlacedImage] = field(default_factory=list)

    def visible(self, positions: range) -> list[int]:
        """How many images each position sees: those whose token comes strictly before it."""
        return [sum(1 for im in self.images if im.start < t) for t in positions]


def image_starts(token_ids: list[int], image_token_id: int, n_images: int) -> list[int]:
    starts = [i for i, t in enumerate(token_ids) if t == image_token_id]
    assert len(starts) == n_images, f"{len(starts)} <|image|> tokens for {n_images} images"
    return starts


class OwlRunner:
    session_store_class = OwlSessionStore  # the engine builds its session store from this (image K/V in entries)
    weight_copy_bytes = 0  # no CPU kernel copies of its weights

    image_placeholder = None  # the chat template writes the image token itself (``<|image|>``)

    def __init__(self, config: EngineConfig, family=None):
        # The registry row (engine/models/families.py): it also tells the engine to keep the DynamicBatch decode path.
        self.family = family or by_architecture()[ARCHITECTURE]
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.cfg = read_config(config.model)  # config.json, and the layout the weight names show
        tokenizer = AutoTokenizer.from_pretrained(config.model, local_files_only=True, trust_remote_code=False)
        self.processor = OwlProcessor(tokenizer, self.cfg.vision.image_size)
        self.image_token_id = self.processor.image_token_id
        self.model = load_model(self.cfg, config.model, self.dtype).to(self.device).eval()
        self.text_config = self.cfg.to_qwen2()  # shapes for DynamicCache and the session store's accounting
        self.max_model_len = config.max_model_len or self.cfg.max_position_embeddings
        self.repetition_penalty = repetition_penalty(folder_generation_config(config.model), config.model,
                                                     config.allow_unverified)
        eos = self.cfg.eos_token_id
        self.eos_ids = self.processor.eos_ids() | ({eos} if isinstance(eos, int) else set(eos or ()))
        self.image_features = ByteLRU(int(config.image_cache_mb * 2**20))
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.hyper_layers = self.cfg.hyper_layer_indices
        # What the no-re-encode test counts: images through the vision tower, and per-image K/V projections.
        self.counters = dict(images_encoded=0, image_kv_computed=0, image_kv_reused=0)
        self._rows: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # request -> RowImages
        self._adopted: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # request -> {(sha, start): kv}
        self._merged: tuple[list[weakref.ref], dict[int, ImageKV], torch.Tensor] | None = None
        log.info("loaded mPLUG-Owl3 %s (%s layout, %d px crops) on %s in %s: %.1f MB of weights, hyper layers %s",
                 config.model, self.cfg.layout.name, self.cfg.vision.image_size, self.device, self.dtype,
                 self.weight_bytes / 2**20, self.hyper_layers)

    # -- images -------------------------------------------------------------------------------------------------
    def adopt_session_images(self, request, images: dict[tuple[str, int], dict]) -> None:
        """The session store hands over image K/V of the conversation's earlier turns (see session.py)."""
        self._adopted[request] = images

    def row_images(self, request) -> RowImages | None:
        return self._rows.get(request)

    def _encode(self, image) -> torch.Tensor:
        """Projected features [crops, tokens_per_crop, hidden] of one PromptImage (all its crops)."""
        feats = self.image_features.get(image.sha256)
        if feats is None:
            pixels = image.pixel_inputs["pixel_values"].to(self.device, self.dtype)
            feats = self.model.encode_images(pixels)
            self.counters["images_encoded"] += 1
            self.image_features.put(image.sha256, feats, feats.nbytes)
        return feats

    def _prepare_row(self, request) -> RowImages:
        """Every crop of every image, placed at its ``<|image|>`` token, with its K/V per hyper layer: adopted from
        the session entry when the same picture sits at the same place, else encoded and projected."""
        prompt = request.prompt
        adopted = self._adopted.pop(request, {})
        starts = iter(image_starts(prompt.token_ids, self.image_token_id,
                                   sum(im.num_image_tokens for im in prompt.images)))
        row = RowImages()
        for image in prompt.images:
            placed = [(f"{image.sha256}/{k}", next(starts)) for k in range(image.num_image_tokens)]
            if all(key in adopted for key in placed):
                self.counters["image_kv_reused"] += 1
                row.images += [PlacedImage(sha, start, adopted[(sha, start)]) for sha, start in placed]
                continue
            feats = self._encode(image)
            assert feats.shape[0] == len(placed), f"{feats.shape[0]} crops for {len(placed)} image tokens"
            self.counters["image_kv_computed"] += 1
            for k, (sha, start) in enumerate(placed):
                pos = torch.tensor([start + 1], device=self.device)  # MI-Rope: right after the crop's token
                kv = {i: self.model.image_kv(i, feats[k:k + 1], pos) for i in self.hyper_layers}
                row.images.append(PlacedImage(sha, start, kv))
        return row

    def _batch_images(self, rows: list[RowImages]) -> dict[int, ImageKV]:
        """Per hyper layer, every row's image K/V left-aligned and padded to the batch's largest image count."""
        merged = {}
        for layer in self.hyper_layers:
            keys, values, image_index = [], [], []
            for row in rows:
                k = [im.kv[layer][0] for im in row.images]
                v = [im.kv[layer][1] for im in row.images]
                keys.append(torch.cat(k, dim=1) if k else None)
                values.append(torch.cat(v, dim=1) if v else None)
                image_index.append(torch.cat([torch.full((im.kv[layer][0].shape[1],), j, device=self.device)
                                         for j, im in enumerate(row.images)]) if row.images else None)
            n = max((o.numel() for o in image_index if o is not None), default=0)
            kvh, d = self.cfg.num_key_value_heads, self.cfg.head_dim
            k_all = torch.zeros(len(rows), kvh, n, d, device=self.device, dtype=self.dtype)
            v_all = torch.zeros_like(k_all)
            slot = torch.full((len(rows), n), ImageKV.PAD_INDEX, device=self.device, dtype=torch.long)
            for b, (k, v, o) in enumerate(zip(keys, values, image_index)):
                if o is not None:
                    k_all[b, :, :o.numel()], v_all[b, :, :o.numel()], slot[b, :o.numel()] = k, v, o
            merged[layer] = ImageKV(k_all, v_all, slot)
        return merged

    # -- forward passes ---------------------------------------------------------------------------------------
    # Both call SDPA directly; on CUDA they keep cuDNN attention out (a plan per new shape: model_runner.py).
    @shape_free_attention
    @torch.inference_mode()
    def prefill(self, request, n_tokens: int) -> torch.Tensor:
        row = self._rows.get(request)
        if row is None:
            row = self._rows[request] = self._prepare_row(request)
        start, end = request.num_computed, request.num_computed + n_tokens
        cache = request.cache if request.cache is not None else DynamicCache(config=self.text_config)
        ids = torch.tensor([request.prompt.token_ids[start:end]], device=self.device)
        logits = self.model.language_model(
            ids, torch.arange(start, end, device=self.device)[None],
            torch.ones(1, end, dtype=torch.long, device=self.device), cache, self._batch_images([row]),
            torch.tensor([row.visible(range(start, end))], device=self.device))
        request.cache = cache
        request.num_computed = end
        return logits[0, -1]

    def can_prefill_together(self, request) -> bool:
        """Never: mPLUG-Owl3 prefills one prompt at a time (batched prefill, engine/batch/prefill_batch.py, is not
        verified for its hyper attention over each row's image K/V)."""
        return False

    def prefill_together(self, requests: list, n_tokens: list[int]) -> list[torch.Tensor]:
        raise NotImplementedError("mPLUG-Owl3 prefills one prompt at a time (can_prefill_together is False)")

    @shape_free_attention
    @torch.inference_mode()
    def decode(self, batch):
        """One step for every row; returns (logits [B, vocab], cache)."""
        images, counts = self._batch_image_state(batch.requests)
        step = batch.step_inputs()
        logits = self.model.language_model(step["input_ids"], step["position_ids"], step["attention_mask"],
                                           step["cache"], images, counts)
        return logits[:, -1], step["cache"]

    def _batch_image_state(self, reqs: list) -> tuple[dict[int, ImageKV], torch.Tensor]:
        """The decode batch's merged image K/V, kept in step with its rows: rows that left are filtered out
        (and padding no remaining row needs is cut), rows that joined are appended; unchanged rows cost nothing."""
        # Weak references: a finished request (and its image K/V) is freed even if no decode step follows.
        old = [ref() for ref in self._merged[0]] if self._merged is not None else []
        if len(old) == len(reqs) and all(a is b for a, b in zip(old, reqs)):
            return self._merged[1], self._merged[2]
        kept = [next(i for i, o in enumerate(old) if o is r) for r in reqs if any(o is r for o in old)]
        if kept and kept == sorted(kept) and all(reqs[n] is old[i] for n, i in enumerate(kept)):
            idx = torch.tensor(kept, device=self.device)
            merged = {layer: _select_rows(kv, idx) for layer, kv in self._merged[1].items()}
            joined = reqs[len(kept):]
            if joined:
                extra = self._batch_images([self._rows[r] for r in joined])
                merged = {layer: _concat_rows(merged[layer], extra[layer]) for layer in merged}
        else:
            merged = self._batch_images([self._rows[r] for r in reqs])
        counts = torch.tensor([[len(self._rows[r].images)] for r in reqs], device=self.device)
        self._merged = ([weakref.ref(r) for r in reqs], merged, counts)
        return merged, counts


def _select_rows(kv: ImageKV, idx: torch.Tensor) -> ImageKV:
    slot = kv.slot_image[idx]
    used = int((slot != ImageKV.PAD_INDEX).sum(1).max()) if slot.numel() else 0  # rows are left-aligned
    return ImageKV(kv.keys[idx][:, :, :used], kv.values[idx][:, :, :used], slot[:, :used])


def _concat_rows(a: ImageKV, b: ImageKV) -> ImageKV:
    n = max(a.keys.shape[2], b.keys.shape[2])

    def pad(t, fill):
        extra = n - t.shape[2] if t.dim() == 4 else n - t.shape[1]
        if extra == 0:
            return t
        shape = list(t.shape)
        shape[2 if t.dim() == 4 else 1] = extra
        return torch.cat([t, t.new_full(shape, fill)], dim=2 if t.dim() == 4 else 1)
    return ImageKV(torch.cat([pad(a.keys, 0), pad(b.keys, 0)]), torch.cat([pad(a.values, 0), pad(b.values, 0)]),
                   torch.cat([pad(a.slot_image, ImageKV.PAD_INDEX), pad(b.slot_image, ImageKV.PAD_INDEX)]))
