"""ModelRunner: the only code that runs the Hugging Face model. Loads a local checkpoint, encodes images,
prefills one request (in chunks) and runs one batched decode step.

What differs between families (see engine/models/families.py) is confined here: model-defined positions (Qwen-VL
M-RoPE, from the model's own ``get_rope_index``) and extra per-token inputs on prefill (Qwen3-VL DeepStack,
Gemma 3 ``token_type_ids``).

It knows tensors, not scheduling: the scheduler picks which prompt tokens to prefill (a chunk may end a little
earlier or later so that it never splits a bidirectional image), and ``LLMEngine.step`` decides when to decode.
"""
from __future__ import annotations

import functools
import logging

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForImageTextToText, AutoProcessor, DynamicCache

from .generation_defaults import repetition_penalty
from . import families
from ..kv import kv_cache
from ..batch import prefill_batch
from ..kv.byte_lru import ByteLRU
from ..config import EngineConfig
from ..kv.session_store import SessionStore

log = logging.getLogger("owlet.engine")


# SDPA kernels the engine lets torch choose from on CUDA. cuDNN attention is left out: it builds an execution plan
# for every new input shape (tens of ms each), and a decode step's K/V length grows by one every step, so eager
# decoding paid a plan build per step (bench/gpu_sdpa_shapes.py measures it). These three need no plan.
SHAPE_FREE_SDPA = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def shape_free_attention(method):
    """Run ``method`` with SDPA limited to kernels that cost nothing per new shape (CUDA only)."""
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self.device.type != "cuda":
            return method(self, *args, **kwargs)
        with sdpa_kernel(SHAPE_FREE_SDPA):
            return method(self, *args, **kwargs)
    wrapper.shape_free_attention = True
    return wrapper


class _NoGpuKernelAdvice(logging.Filter):
    """Drops transformers' advice to install a GPU kernel package (``causal_conv1d`` for LFM2's convolutions): on a
    CPU it cannot be used, and it was the worker's first words on the first question."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "falling back to its reference PyTorch implementation" not in record.getMessage()


def quiet_gpu_kernel_advice() -> None:
    """Install ``_NoGpuKernelAdvice`` on transformers' kernel logger (once)."""
    logger = logging.getLogger("transformers.integrations.hub_kernels")
    if not any(isinstance(f, _NoGpuKernelAdvice) for f in logger.filters):
        logger.addFilter(_NoGpuKernelAdvice())


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


def require_chat_template(processor, folder: str) -> None:
    """Refuse, at load, a checkpoint whose processor has no chat template: every question would fail on it."""
    tokenizer = getattr(processor, "tokenizer", None)
    if getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None):
        return
    raise ValueError(f"{folder} has no chat template (chat_template.jinja, chat_template.json, or a chat_template "
                     "entry in processor_config.json or tokenizer_config.json), so no question can be put to it: "
                     "copy every file of the model repository into the folder")


class ModelRunner:
    session_store_class = SessionStore  # the engine builds its session store from this (a custom runner's may differ)

    def __init__(self, config: EngineConfig, family: families.Family | None = None):
        self.family = family or families.resolve(config.model, config.allow_unverified)
        self.device = resolve_device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        if self.device.type == "cpu":
            quiet_gpu_kernel_advice()
        self.processor = AutoProcessor.from_pretrained(
            config.model, trust_remote_code=config.trust_remote_code, local_files_only=True)
        require_chat_template(self.processor, config.model)
        self.model = AutoModelForImageTextToText.from_pretrained(
            config.model, dtype=self.dtype, trust_remote_code=config.trust_remote_code, local_files_only=True,
        ).to(self.device).eval()
        self.text_config = self.model.config.get_text_config()
        families.check_cache_layers(self.family, self.text_config, config.allow_unverified)
        # what its generation_config.json asks of every answer (engine/models/generation_defaults.py)
        self.repetition_penalty = repetition_penalty(self.model.generation_config, config.model,
                                                     config.allow_unverified)
        self.image_token_id = self.model.config.image_token_id
        attr = self.family.image_placeholder
        self.image_placeholder = getattr(self.processor, attr) if attr else None  # None: the image token itself
        self.max_model_len = config.max_model_len or getattr(self.text_config, "max_position_embeddings", 4096)
        self.eos_ids = self._eos_ids()
        self.image_features = ByteLRU(int(config.image_cache_mb * 2**20))
        self.vision_forwards = 0  # vision tower calls (a batched prefill encodes a burst's images together)
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self._embed = self.model.get_input_embeddings()
        log.info("loaded %s (%s) on %s in %s: %.1f MB of weights", config.model,
                 type(self.model).__name__, self.device, self.dtype, self.weight_bytes / 2**20)
        self.weight_copy_bytes = 0  # the bytes of weight copies the CPU kernels made
        if self.device.type == "cpu" and config.cpu_kernels != "off":
            from . import cpu  # CPU-only code: imported only where it can run and is wanted

            self.weight_copy_bytes = cpu.install(self.model, config.cpu_kernels, config.max_running, self.dtype)

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
        (feats, _), hit = self.encode_image_full(image)
        return feats, hit

    @shape_free_attention
    def encode_image_full(self, image) -> tuple[tuple[torch.Tensor, list | None], bool]:
        """(features, DeepStack features per layer or None) for one PromptImage, and whether it was cached."""
        cached = self.image_features.get(image.sha256)
        if cached is not None:
            return cached, True
        inputs = {k: v.to(self.device) for k, v in image.pixel_inputs.items()}
        if "pixel_values" in inputs:
            inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
        out = self.model.get_image_features(**inputs)
        self.vision_forwards += 1
        feats = _flat_features(getattr(out, "pooler_output", out))
        assert feats.shape[0] == image.num_image_tokens, (
            f"vision tower gave {feats.shape[0]} features for {image.num_image_tokens} image tokens")
        deep = None
        if "deepstack" in self.family.extra_inputs:
            deep = [_flat_features(layer) for layer in out.deepstack_features]
        value = (feats, deep)
        self.image_features.put(image.sha256, value, feats.nbytes + sum(d.nbytes for d in deep or ()))
        return value, False

    @shape_free_attention
    @torch.inference_mode()
    def encode_images(self, images) -> dict:
        """Encode the images among ``images`` that are not cached, those of one pixel layout (the same tensor
        shapes past the first axis) in one vision forward; returns {sha256: (features, None)} for those encoded
        now (they are cached too). A batched prefill calls this first, so a burst of new images costs a few vision
        forwards instead of one per image. DeepStack (per-layer features) is left to ``encode_image_full``."""
        if "deepstack" in self.family.extra_inputs:
            return {}
        todo = {}
        for image in images:
            if image.sha256 not in todo and image.sha256 not in self.image_features:
                todo[image.sha256] = image
        layouts: dict[tuple, list] = {}
        for image in todo.values():
            key = tuple(sorted((k, tuple(v.shape[1:])) for k, v in image.pixel_inputs.items()))
            layouts.setdefault(key, []).append(image)
        encoded = {}
        for group in layouts.values():
            if len(group) < 2:
                continue  # encode_image_full does it when the prompt is embedded
            inputs = {k: torch.cat([img.pixel_inputs[k] for img in group]).to(self.device)
                      for k in group[0].pixel_inputs}
            if "pixel_values" in inputs:
                inputs["pixel_values"] = inputs["pixel_values"].to(self.dtype)
            out = self.model.get_image_features(**inputs)
            self.vision_forwards += 1
            feats = _flat_features(getattr(out, "pooler_output", out))
            counts = [img.num_image_tokens for img in group]
            assert feats.shape[0] == sum(counts), (
                f"vision tower gave {feats.shape[0]} features for {sum(counts)} image tokens")
            for img, part in zip(group, feats.split(counts)):
                value = (part.clone(), None)  # its own storage: the cache accounts and frees it alone
                encoded[img.sha256] = value
                self.image_features.put(img.sha256, value, value[0].nbytes)
        return encoded

    def embed_prompt(self, request, encoded: dict | None = None) -> torch.Tensor:
        """Input embeddings [T - num_computed, hidden] for the part of the prompt not yet in the cache, with
        image slots filled by vision features.

        Images whose tokens all lie in the already-cached prefix are skipped: reusing a session never
        re-encodes the image it already saw. ``encoded``: features ``encode_images`` just computed (not hits).
        """
        base = request.num_computed
        ids = torch.tensor(request.prompt.token_ids, device=self.device)
        embeds = self._embed(ids[base:])
        deepstack = "deepstack" in self.family.extra_inputs
        if deepstack:
            n_deep = len(self.model.config.vision_config.deepstack_visual_indexes)
            request.scratch.extra = dict(visual_mask=(ids[base:] == self.image_token_id),
                                 deepstack=[torch.zeros_like(embeds) for _ in range(n_deep)])
        slots = (ids == self.image_token_id).nonzero().flatten()
        start = 0
        for image in request.prompt.images:
            positions = slots[start:start + image.num_image_tokens]
            start += image.num_image_tokens
            if positions.numel() and int(positions[-1]) >= base:
                if encoded and image.sha256 in encoded:
                    (feats, deep), hit = encoded[image.sha256], False
                else:
                    (feats, deep), hit = self.encode_image_full(image)
                request.image_cache_hits += int(hit)
                keep = positions >= base  # an image can straddle the cached boundary
                embeds[positions[keep] - base] = feats[keep].to(embeds.dtype)
                for layer, d in zip(request.scratch.extra["deepstack"] if deepstack else (), deep or ()):
                    layer[positions[keep] - base] = d[keep].to(embeds.dtype)
        return embeds

    def prepare_positions(self, request) -> None:
        """Model-defined positions for the whole prompt, and the row's decode delta after it.

        M-RoPE (Qwen-VL): the model's own ``get_rope_index`` gives image tokens 3D (time, height, width)
        positions, and text after an image continues from the image's largest position + 1, so a row decodes at
        its cache length plus a (negative) delta. Computed over the full prompt every turn: a session-restored
        prefix gets exactly the positions it was cached with, because they depend only on the token ids.
        """
        if self.family.positions != "mrope":
            request.scratch.positions, request.scratch.position_delta = None, 0
            return
        ids = torch.tensor([request.prompt.token_ids], device=self.device)
        grids = [img.pixel_inputs["image_grid_thw"] for img in request.prompt.images]
        positions, delta = self.model.model.get_rope_index(
            ids, mm_token_type_ids=(ids == self.image_token_id).int(),
            image_grid_thw=torch.cat(grids).to(self.device) if grids else None)
        request.scratch.positions, request.scratch.position_delta = positions[:, 0], int(delta.flatten()[0])

    # -- forward passes -------------------------------------------------------
    @shape_free_attention
    @torch.inference_mode()
    def prefill(self, request, n_tokens: int) -> torch.Tensor:
        """Run the next ``n_tokens`` prompt tokens of ``request`` (a few more or fewer to keep an image whole,
        see ``_chunk_end``) through its private cache; returns last logits."""
        if request.scratch.embeds is None:
            request.scratch.embeds = self.embed_prompt(request)
            request.scratch.embeds_offset = request.num_computed
            self.prepare_positions(request)
        start = request.num_computed
        end = self._chunk_end(request, start, start + n_tokens)
        offset = request.scratch.embeds_offset
        if request.scratch.positions is None:
            positions = torch.arange(start, end, device=self.device)[None]
        else:
            positions = request.scratch.positions[:, None, start:end]
        inputs = dict(
            inputs_embeds=request.scratch.embeds[None, start - offset:end - offset],
            attention_mask=torch.ones(1, end, dtype=torch.long, device=self.device),
            position_ids=positions,
            cache=request.cache,
            use_cache=True,
        )
        if "token_type_ids" in self.family.extra_inputs:
            # Gemma 3: image tokens attend to each other both ways. The mask reads the types by absolute
            # position, so they span the sequence from its start, not just this chunk.
            ids = torch.tensor(request.prompt.token_ids[:end], device=self.device)
            inputs["token_type_ids"] = (ids == self.image_token_id).long()[None]
        if "deepstack" in self.family.extra_inputs:
            logits, cache = self._prefill_deepstack(request, inputs, start - offset, end - offset)
        else:
            out = self.model(**inputs, logits_to_keep=1)
            logits, cache = out.logits[0, -1], out.cache
        request.cache = cache
        request.num_computed = end
        if end == request.prompt_len:  # the prompt is in the cache: only the positions are needed from here
            request.scratch.embeds = request.scratch.extra = None
        return logits

    def can_prefill_together(self, request) -> bool:
        """Whether ``request`` may join a batched prefill (engine/batch/prefill_batch.py): its family row was verified
        token-exact that way, its conv layers (if any) have no bias, and it starts from nothing but the template
        head."""
        return (self.family.prefill_together and not getattr(self.text_config, "conv_bias", False)
                and prefill_batch.starts_fresh(request))

    @shape_free_attention
    @torch.inference_mode()
    def prefill_together(self, requests: list, n_tokens: list[int]) -> list[torch.Tensor]:
        """Prefill the first ``n_tokens[i]`` tokens of each request (all start fresh, see
        ``can_prefill_together``) in one left-padded forward; returns each one's last logits, as ``prefill``.

        No request's cache or progress changes until the forward has succeeded (only its embeddings are built,
        and a template head it held is dropped): on an error the engine can prefill them one at a time instead."""
        ends = []
        for req, n in zip(requests, n_tokens):
            ends.append(self._chunk_end(req, 0, req.num_computed + n))
            if req.num_computed:  # only the template head: recomputed here with the rest
                prefill_batch.reset_head(req)
        fresh = [req for req in requests if req.scratch.embeds is None or req.scratch.embeds_offset]
        encoded = self.encode_images([img for req in fresh for img in req.prompt.images])
        for req in fresh:
            req.scratch.embeds, req.scratch.embeds_offset = self.embed_prompt(req, encoded), 0
            self.prepare_positions(req)
        batch, longest = len(requests), max(ends)
        hidden = requests[0].scratch.embeds.shape[-1]
        embeds = requests[0].scratch.embeds.new_zeros(batch, longest, hidden)
        mask = torch.zeros(batch, longest, dtype=torch.long, device=self.device)
        mrope = self.family.positions == "mrope"
        positions = torch.zeros((3, batch, longest) if mrope else (batch, longest), dtype=torch.long,
                                device=self.device)
        for row, (req, end) in enumerate(zip(requests, ends)):
            pad = longest - end
            embeds[row, pad:] = req.scratch.embeds[:end]
            mask[row, pad:] = 1
            if mrope:
                positions[:, row, pad:] = req.scratch.positions[:, :end]
            else:
                positions[row, pad:] = torch.arange(end, device=self.device)
        out = self.model(inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                         cache=DynamicCache(config=self.text_config), use_cache=True, logits_to_keep=1)
        caches = [kv_cache.row_cache(out.cache, row, end, self.text_config) for row, end in enumerate(ends)]
        for req, cache, end in zip(requests, caches, ends):
            req.cache, req.num_computed = cache, end
            if end == req.prompt_len:
                req.scratch.embeds = req.scratch.extra = None
        return list(out.logits[:, -1])

    def _chunk_end(self, request, start: int, end: int) -> int:
        """Where this prefill chunk ends. With bidirectional attention inside an image (Gemma 3) a chunk must
        not split an image: tokens in the first part would miss the rest. Stop before the image, or, if the
        chunk starts inside it, run to its end."""
        ids = request.prompt.token_ids
        end = min(end, len(ids))
        if "token_type_ids" not in self.family.extra_inputs or end >= len(ids):
            return end
        image = self.image_token_id
        if ids[end - 1] != image or ids[end] != image:
            return end
        cut = end
        while cut > start and ids[cut - 1] == image:
            cut -= 1
        if cut > start:
            return cut
        while end < len(ids) and ids[end] == image:
            end += 1
        return end

    def _prefill_deepstack(self, request, inputs: dict, lo: int, hi: int):
        """Qwen3-VL: the chunk's vision tokens also get their DeepStack features added in the first decoder
        layers. The outer model only builds those from pixels, so the language model is called directly."""
        mask = request.scratch.extra["visual_mask"][lo:hi]
        if bool(mask.any()):
            inputs["visual_pos_masks"] = mask[None]
            inputs["deepstack_visual_embeds"] = [d[lo:hi][mask] for d in request.scratch.extra["deepstack"]]
        out = self.model.model.language_model(**inputs)
        logits = self.model.lm_head(out.last_hidden_state[:, -1:])
        return logits[0, -1], out.cache

    @shape_free_attention
    @torch.inference_mode()
    def decode(self, batch) -> tuple[torch.Tensor, object]:
        """One decode step for every row of ``batch``; returns (logits [B, vocab], the updated cache).

        It advances nothing itself: the engine samples, then ``batch.advance`` records the step."""
        if batch.static_step is not None:  # static shapes / CUDA graphs (engine/batch/cuda_graphs.py)
            return batch.static_step(batch), batch.cache
        inputs = batch.step_inputs()
        if self.family.positions == "mrope":  # the same position on every rotary axis for generated text
            inputs["position_ids"] = inputs["position_ids"][None].expand(3, -1, -1)
        out = self.model(**inputs, logits_to_keep=1)
        return out.logits[:, -1], out.cache


def _flat_features(feats) -> torch.Tensor:
    """[tokens, hidden] from a vision output that may be a per-image tuple or a batched tensor."""
    if isinstance(feats, (list, tuple)):
        return torch.cat(list(feats), dim=0)
    return feats.reshape(-1, feats.shape[-1])
