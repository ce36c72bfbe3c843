"""ModelRunner: the only code that runs the Hugging Face model. Loads a local checkpoint, encodes images,
prefills one request (in chunks) and runs one batched decode step.

It knows tensors, not scheduling: which request to prefill and when to decode is the scheduler's business.
"""
from __future__ import annotations

import logging

import torch
from transformers import AutoModelForImageTextToText, AutoProcessor

from .byte_lru import ByteLRU
from .config import EngineConfig

log = logging.getLogger("owlet.engine")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def cpu_has_native_bf16() -> bool:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: fp16 on CUDA; on CPU bf16 where the CPU has native bf16 (fp16 is 3-4x slower there), else fp32."""
    if name != "auto":
        return getattr(torch, name)
    if device.type == "cuda":
        return torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


class ModelRunner:
    def __init__(self, config: EngineConfig):
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.processor = AutoProcessor.from_pretrained(
            config.model, trust_remote_code=config.trust_remote_code, local_files_only=True)
        self.model = AutoModelForImageTextToText.from_pretrained(
            config.model, dtype=self.dtype, trust_remote_code=config.trust_remote_code, local_files_only=True,
        ).to(self.device).eval()
        self.text_config = self.model.config.get_text_config()
        self.image_token_id = self.model.config.image_token_id
        self.max_model_len = config.max_model_len or getattr(self.text_config, "max_position_embeddings", 4096)
        self.eos_ids = self._eos_ids()
        self.image_features = ByteLRU(int(config.image_cache_mb * 2**20))
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self._embed = self.model.get_input_embeddings()
        log.info("loaded %s (%s) on %s in %s: %.1f MB of weights", config.model,
                 type(self.model).__name__, self.device, self.dtype, self.weight_bytes / 2**20)

    def _eos_ids(self) -> set[int]:
        ids = set()
        for src in (self.model.generation_config.eos_token_id, self.processor.tokenizer.eos_token_id):
            if isinstance(src, int):
                ids.add(src)
            elif src:
                ids.update(src)
        return ids

    # -- images ---------------------------------------------------------------
    def encode_image(self, image) -> tuple[torch.Tensor, bool]:
        """Projected vision features [num_image_tokens, hidden] for one PromptImage, and whether it was cached."""
        cached = self.image_features.get(image.sha256)
        if cached is not None:
            return cached, True
        inputs = {k: v.to(self.device) for k, v in image.pixel_inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        out = self.model.get_image_features(**inputs)
        feats = getattr(out, "pooler_output", out)
        feats = torch.cat(list(feats), dim=0) if isinstance(feats, (list, tuple)) else feats.reshape(-1, feats.shape[-1])
        assert feats.shape[0] == image.num_image_tokens, (
            f"vision tower gave {feats.shape[0]} features for {image.num_image_tokens} image tokens")
        self.image_features.put(image.sha256, feats, feats.nbytes)
        return feats, False

    def embed_prompt(self, request) -> torch.Tensor:
        """Input embeddings [T - num_computed, hidden] for the part of the prompt not yet in the cache, with
        image slots filled by vision features.

        Images whose tokens all lie in the already-cached prefix are skipped: reusing a session never
        re-encodes the image it already saw.
        """
        base = request.num_computed
        ids = torch.tensor(request.prompt.token_ids, device=self.device)
        embeds = self._embed(ids[base:])
        slots = (ids == self.image_token_id).nonzero().flatten()
        start = 0
        for image in request.prompt.images:
            positions = slots[start:start + image.num_image_tokens]
            start += image.num_image_tokens
            if positions.numel() and int(positions[-1]) >= base:
                feats, hit = self.encode_image(image)
                request.image_cache_hits += int(hit)
                keep = positions >= base  # an image can straddle the cached boundary
                embeds[positions[keep] - base] = feats[keep].to(embeds.dtype)
        return embeds

    # -- forward passes -------------------------------------------------------
    @torch.inference_mode()
    def prefill(self, request, n_tokens: int) -> torch.Tensor:
        """Run the next ``n_tokens`` prompt tokens of ``request`` through its private cache; returns last logits."""
        if request.embeds is None:
            request.embeds = self.embed_prompt(request)
            request.embeds_offset = request.num_computed
        start, end = request.num_computed, request.num_computed + n_tokens
        offset = request.embeds_offset
        out = self.model(
            inputs_embeds=request.embeds[None, start - offset:end - offset],
            attention_mask=torch.ones(1, end, dtype=torch.long, device=self.device),
            position_ids=torch.arange(start, end, device=self.device)[None],
            cache=request.cache,
            use_cache=True,
            logits_to_keep=1,
        )
        request.cache = out.cache
        request.num_computed = end
        return out.logits[0, -1]

    @torch.inference_mode()
    def decode(self, batch) -> torch.Tensor:
        """One decode step for every row of ``batch``; returns logits [B, vocab] and advances nothing."""
        if getattr(batch, "static_step", None) is not None:  # static shapes / CUDA graphs (engine/cuda_graphs.py)
            return batch.static_step(batch), batch.cache
        out = self.model(**batch.step_inputs(), logits_to_keep=1)
        return out.logits[:, -1], out.cache
