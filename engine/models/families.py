"""The registry of model families Owlet has verified token-exact against per-request ``generate()``.

One table, keyed by the checkpoint's ``architectures`` entry in config.json. Each row says what the engine must
do for that family beyond "embed, run, decode":

- ``positions``: ``linear`` (position = token index) or ``mrope`` (Qwen-VL's 3D rotary positions, computed by
  the model's own ``get_rope_index``; after the prompt each row decodes at its length plus a per-row delta);
- ``extra_inputs``: ``deepstack`` (Qwen3-VL adds vision features inside its first decoder layers) and
  ``token_type_ids`` (Gemma 3 attends bidirectionally within each image);
- ``cache_layers``: the cache layer kinds it uses (``full``, ``sliding``, ``conv``);
- ``image_placeholder``: the processor attribute naming the text its chat template emits per image, when it is
  not the image-feature token itself (Gemma 3 emits ``<start_of_image>``);
- ``decode_batch``: the decode batch it runs on and was verified with (engine/batch/decode_batch.py): ``slots``
  (preallocated per-row K/V, written in place: full-attention and conv layers, linear positions) or ``dynamic``
  (a concatenated ``DynamicCache``: any layer kind, M-RoPE). This row is the only place the choice is made;
- ``prefill_together``: prompts admitted in the same step may be prefilled in one left-padded forward
  (engine/batch/prefill_batch.py); False where that was not verified token-exact (the family then prefills one
  prompt at a time, as before);
- ``runner``: ``"module:Class"`` of a custom runner for families Hugging Face does not serve natively
  (e.g. a native mPLUG-Owl3). It is built as ``Class(config, family=row)`` and must be a ``Runner``
  (engine/models/runner_interface.py), as the generic ``ModelRunner`` is.

A checkpoint whose architecture is not listed is refused at load with the list of supported ones, unless the
operator sets ``allow_unverified`` (``OWLET_ALLOW_UNVERIFIED=true``); then it runs the generic path with a
warning, because its answers may be silently wrong.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from . import transformers_version

log = logging.getLogger("owlet.engine")


@dataclass(frozen=True)
class Family:
    name: str  # what people call it (README)
    architecture: str  # config.json "architectures"[0]
    positions: str = "linear"  # linear | mrope
    extra_inputs: tuple[str, ...] = ()  # deepstack | token_type_ids
    cache_layers: tuple[str, ...] = ("full",)  # full | sliding | conv
    image_placeholder: str | None = None  # processor attribute holding the template's per-image placeholder
    decode_batch: str = "slots"  # slots | dynamic
    runner: str | None = None  # "module:Class" of a custom ModelRunner
    prefill_together: bool = True  # batched prefill verified token-exact (engine/batch/prefill_batch.py)
    example: str = ""  # a public checkpoint of the family (README)

    def __post_init__(self):
        if self.decode_batch not in ("slots", "dynamic"):
            raise ValueError(f"{self.name}: decode_batch must be slots or dynamic, got {self.decode_batch!r}")
        slot_layers = set(self.cache_layers) <= {"full", "conv"}
        if self.decode_batch == "slots" and (self.positions != "linear" or not slot_layers):
            raise ValueError(f"{self.name}: the slot pool holds full and conv layers at linear positions only "
                             f"(engine/kv/slot_cache.py); this row needs decode_batch='dynamic'")


FAMILIES: tuple[Family, ...] = (
    Family("LFM2-VL", "Lfm2VlForConditionalGeneration", cache_layers=("full", "conv"),
           example="LiquidAI/LFM2-VL-450M"),
    Family("LLaVA", "LlavaForConditionalGeneration", example="llava-hf/llava-interleave-qwen-0.5b-hf"),
    Family("Qwen2-VL", "Qwen2VLForConditionalGeneration", positions="mrope", decode_batch="dynamic",
           example="Qwen/Qwen2-VL-2B-Instruct"),
    Family("Qwen2.5-VL", "Qwen2_5_VLForConditionalGeneration", positions="mrope", decode_batch="dynamic",
           example="Qwen/Qwen2.5-VL-3B-Instruct"),
    # Batched prefill is not built for DeepStack's per-layer vision inputs, nor for Gemma 3's bidirectional image
    # mask: both prefill one prompt at a time.
    Family("Qwen3-VL", "Qwen3VLForConditionalGeneration", positions="mrope", extra_inputs=("deepstack",),
           decode_batch="dynamic", prefill_together=False, example="Qwen/Qwen3-VL-2B-Instruct"),
    Family("Gemma 3", "Gemma3ForConditionalGeneration", extra_inputs=("token_type_ids",),
           cache_layers=("full", "sliding"), image_placeholder="image_token", decode_batch="dynamic",
           prefill_together=False, example="google/gemma-3-4b-it"),
    Family("Mistral 3", "Mistral3ForConditionalGeneration", cache_layers=("full", "sliding"), decode_batch="dynamic",
           example="mistralai/Mistral-Small-3.1-24B-Instruct-2503"),
    Family("Idefics3", "Idefics3ForConditionalGeneration", example="HuggingFaceM4/Idefics3-8B-Llama3"),
    Family("SmolVLM", "SmolVLMForConditionalGeneration", example="HuggingFaceTB/SmolVLM2-2.2B-Instruct"),
    Family("InternVL", "InternVLForConditionalGeneration", example="OpenGVLab/InternVL3-1B-hf"),
    # Not a transformers model: Owlet's own implementation (hyper attention, image K/V kept per row and session).
    Family("mPLUG-Owl3", "mPLUGOwl3Model", decode_batch="dynamic", runner="engine.models.mplug_owl3.runner:OwlRunner",
           prefill_together=False, example="mPLUG/mPLUG-Owl3-2B-241014"),
)

# An architecture served only with allow_unverified: the generic runner on the path that takes any layer kind.
UNVERIFIED = Family("unverified", "*", decode_batch="dynamic", prefill_together=False)


def by_architecture(families=FAMILIES) -> dict[str, Family]:
    return {f.architecture: f for f in families}


def checkpoint_architecture(folder: str) -> str | None:
    """The first ``architectures`` entry of a local checkpoint's config.json (None if it names none)."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    try:
        archs = json.loads(path.read_text()).get("architectures") or []
    except (OSError, ValueError):
        return None
    return archs[0] if archs else None


def supported_list(families=FAMILIES) -> str:
    return ", ".join(f"{f.name} ({f.architecture})" for f in families)


def resolve(model_folder: str, allow_unverified: bool = False, families=FAMILIES) -> Family:
    """The registry row for a checkpoint; refuses an unverified architecture unless explicitly allowed, and a
    folder that is no checkpoint at all (whatever is allowed), saying which."""
    folder = Path(model_folder)
    if not (folder / "config.json").is_file():
        from .checkpoint_folder import not_found_advice

        what = "not a checkpoint folder: it has no config.json" if folder.is_dir() else "no such folder"
        raise ValueError(f"{model_folder}: {what}.{not_found_advice(model_folder)} A model folder holds every file "
                         "of a downloaded model repository (config.json, the weights, the tokenizer and processor "
                         "files).")
    arch = checkpoint_architecture(model_folder)
    family = by_architecture(families).get(arch)
    if family is not None:
        return family
    what = f"architecture {arch!r}" if arch else "no 'architectures' entry in config.json"
    if not allow_unverified:
        raise ValueError(
            f"{model_folder}: {what} is not a model family Owlet has verified, so its answers could be silently "
            f"wrong. Supported: {supported_list(families)}. To try it anyway, set OWLET_ALLOW_UNVERIFIED=true "
            f"(EngineConfig.allow_unverified).")
    log.warning("%s: %s is not verified; running it on the generic path because allow_unverified is set. "
                "Answers may differ from the model's own generate().", model_folder, what)
    return UNVERIFIED


def check_cache_layers(family: Family, text_config, allow_unverified: bool) -> None:
    """Refuse a checkpoint of a known family whose cache needs a layer kind that was not verified for it."""
    if family is UNVERIFIED:
        return
    from ..kv.cache_layers import cache_layer_kinds  # torch and transformers load only with a model

    extra = cache_layer_kinds(text_config) - set(family.cache_layers)
    if not extra:
        return
    message = (f"this {family.name} checkpoint uses cache layers of kind {sorted(extra)}, which Owlet has not "
               f"verified for {family.name} (verified: {list(family.cache_layers)})")
    if not allow_unverified:
        raise ValueError(message + ". To try it anyway, set OWLET_ALLOW_UNVERIFIED=true.")
    log.warning("%s; running anyway because allow_unverified is set", message)
