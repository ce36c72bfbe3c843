"""Build small Hugging Face VLM checkpoints offline: a local tokenizer, a processor and a random-init model.

Tests and benchmarks need real checkpoint folders (written with ``save_pretrained`` and loaded back through
``AutoModelForImageTextToText`` / ``AutoProcessor``, exactly like a downloaded model), but no hub is reachable.
This module makes them in seconds:

- ``train_tokenizer`` trains a byte-level BPE with ``tokenizers`` and wraps it as ``PreTrainedTokenizerFast``
  with the special tokens LFM2-VL and LLaVA expect;
- ``CHAT_TEMPLATE`` is a ChatML template that maps ``{"type": "image"}`` items to the ``<image>`` placeholder;
- ``build_lfm2vl_checkpoint`` / ``build_llava_checkpoint`` assemble processor + model and save them;
- ``ensure_tiny_checkpoint(family)`` caches a tiny checkpoint per family under ``.cache/`` (gitignored).

The demo model (``training/``) reuses the tokenizer, template and processor pieces with its own sizes.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

IMAGE_TOKEN = "<image>"
IMAGE_START = "<|image_start|>"
IMAGE_END = "<|image_end|>"
IMAGE_THUMBNAIL = "<|img_thumbnail|>"
PAD, BOS, EOS_TURN = "<|pad|>", "<|startoftext|>", "<|im_end|>"
IM_START = "<|im_start|>"
# LFM2-VL marks image tiles with row/column tokens; a few rows and columns cover the tiling grids we allow.
TILE_TOKENS = [f"<|img_row_{r}_col_{c}|>" for r in range(1, 5) for c in range(1, 5)]
SPECIAL_TOKENS = [PAD, BOS, IM_START, EOS_TURN, IMAGE_TOKEN, IMAGE_START, IMAGE_END, IMAGE_THUMBNAIL, *TILE_TOKENS]

# ChatML, as LFM2 uses. Images become the processor's placeholder, which it expands to the image's token count.
CHAT_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<image>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)

_DEFAULT_CORPUS = [
    "What colour is the circle? The circle is red.",
    "How many squares are there? There are two squares.",
    "Where is the triangle? It is on the left, near the top.",
    "Describe the image. A small blue star and a large green square on a striped background.",
    "Is there a red square? Yes. No. Which shape is largest? The circle.",
    "Überraschung: naïve café, déjà vu — 日本語のテキスト, emoji 🦉 and more.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
]


def train_tokenizer(texts: list[str] | None = None, vocab_size: int = 512):
    """Train a byte-level BPE on ``texts`` and wrap it with Owlet's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(texts or _DEFAULT_CORPUS)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS_TURN,
        pad_token=PAD,
        extra_special_tokens={
            "image_token": IMAGE_TOKEN,
            "image_start_token": IMAGE_START,
            "image_end_token": IMAGE_END,
            "image_thumbnail_token": IMAGE_THUMBNAIL,
        },
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_lfm2vl_processor(tokenizer, *, max_image_tokens: int = 16, min_image_tokens: int = 4,
                          do_image_splitting: bool = False, **image_kwargs):
    """An ``Lfm2VlProcessor`` whose images are small (``max_image_tokens`` tokens after 2x downsampling)."""
    from transformers import Lfm2VlImageProcessor, Lfm2VlProcessor

    image_processor = Lfm2VlImageProcessor(
        max_image_tokens=max_image_tokens,
        min_image_tokens=min_image_tokens,
        do_image_splitting=do_image_splitting,
        **image_kwargs,
    )
    return Lfm2VlProcessor(image_processor=image_processor, tokenizer=tokenizer, chat_template=CHAT_TEMPLATE)


def build_lfm2vl_checkpoint(out_dir: str | Path, *, tokenizer=None, processor=None,
                            text_overrides: dict | None = None, vision_overrides: dict | None = None,
                            projector_hidden_size: int = 64, seed: int = 0, dtype: str = "float32") -> Path:
    """Write a random-init ``Lfm2VlForConditionalGeneration`` checkpoint with its processor to ``out_dir``."""
    import torch
    from transformers import Lfm2Config, Lfm2VlConfig, Lfm2VlForConditionalGeneration, Siglip2VisionConfig

    tokenizer = tokenizer or train_tokenizer()
    processor = processor or make_lfm2vl_processor(tokenizer)
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        layer_types=["conv", "full_attention", "conv", "full_attention"],
        # A wider init than the 0.02 default makes a random model's greedy output varied and image-dependent,
        # so exactness tests compare interesting token streams instead of one repeated token.
        initializer_range=0.1,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    text.update(text_overrides or {})
    if "layer_types" not in (text_overrides or {}) and text["num_hidden_layers"] != 4:
        n = text["num_hidden_layers"]
        text["layer_types"] = ["full_attention" if i % 3 == 1 else "conv" for i in range(n)]
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  patch_size=16, num_patches=256)
    vision.update(vision_overrides or {})
    config = Lfm2VlConfig(
        text_config=Lfm2Config(**text).to_dict(),
        vision_config=Siglip2VisionConfig(**vision).to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        projector_hidden_size=projector_hidden_size,
    )
    torch.manual_seed(seed)
    model = Lfm2VlForConditionalGeneration(config).to(getattr(torch, dtype))
    _set_generation_ids(model, tokenizer)
    return _save(out_dir, model, processor)


def build_llava_checkpoint(out_dir: str | Path, *, tokenizer=None, text_overrides: dict | None = None,
                           vision_overrides: dict | None = None, image_size: int = 32, patch_size: int = 8,
                           seed: int = 0) -> Path:
    """Write a random-init LLaVA-style checkpoint (SigLIP vision + Llama text) with its processor."""
    import torch
    from transformers import (LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor,
                              SiglipImageProcessor, SiglipVisionConfig)

    tokenizer = tokenizer or train_tokenizer()
    image_processor = SiglipImageProcessor(size={"height": image_size, "width": image_size})
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=patch_size,
                               vision_feature_select_strategy="full", chat_template=CHAT_TEMPLATE)
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                initializer_range=0.3,  # varied greedy output, see build_lfm2vl_checkpoint
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id)
    text.update(text_overrides or {})
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=patch_size)
    vision.update(vision_overrides or {})
    config = LlavaConfig(
        text_config=LlamaConfig(**text).to_dict(),
        vision_config=SiglipVisionConfig(**vision).to_dict(),
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        vision_feature_select_strategy="full",
        vision_feature_layer=-1,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).float()
    _set_generation_ids(model, tokenizer)
    return _save(out_dir, model, processor)


def _set_generation_ids(model, tokenizer) -> None:
    gc = model.generation_config
    gc.eos_token_id = tokenizer.eos_token_id
    gc.pad_token_id = tokenizer.pad_token_id
    gc.bos_token_id = tokenizer.bos_token_id


def _save(out_dir: str | Path, model, processor) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    processor.save_pretrained(out)
    return out


def _family_builder(name: str, **kw):
    def build(out_dir):
        from . import tiny_families
        return getattr(tiny_families, name)(out_dir, **kw)
    return build


def _without_eos(build):
    """``build``, then ``silence_eos``: a checkpoint whose answers run to their length limit (for tests that need an
    answer still running when they act on it: the random model otherwise often stops after a few dozen tokens)."""
    def build_endless(out_dir):
        from transformers import AutoTokenizer

        build(out_dir)
        silence_eos(out_dir, AutoTokenizer.from_pretrained(out_dir).eos_token_id)
    return build_endless


_BUILDERS = {
    "lfm2vl": build_lfm2vl_checkpoint, "llava": build_llava_checkpoint,
    "lfm2vl-endless": _without_eos(build_lfm2vl_checkpoint),
    # The families people bring (training/tiny_families.py), each with its real processor class.
    "qwen2vl": _family_builder("build_qwen_vl_checkpoint", kind="qwen2vl"),
    "qwen2_5vl": _family_builder("build_qwen_vl_checkpoint", kind="qwen2_5vl"),
    "qwen3vl": _family_builder("build_qwen_vl_checkpoint", kind="qwen3vl"),
    "gemma3": _family_builder("build_gemma3_checkpoint"),
    "mistral3": _family_builder("build_mistral3_checkpoint"),
    "idefics3": _family_builder("build_idefics3_checkpoint"),
    "smolvlm": _family_builder("build_idefics3_checkpoint", smolvlm=True),
    "internvl": _family_builder("build_internvl_checkpoint"),
}
# Bump when the tiny shapes change, so cached folders are rebuilt instead of silently reused.
_TINY_VERSION = 6


def silence_eos(folder: str | Path, eos_id: int) -> None:
    """Zero the EOS rows of a saved checkpoint's input embedding and LM head: its logit becomes exactly 0 while the
    others are random, so greedy decoding does not stop early and every answer runs to its length limit."""
    import torch
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(folder, dtype="auto")  # keep the saved dtype
    with torch.no_grad():
        model.get_input_embeddings().weight[eos_id].zero_()
        model.get_output_embeddings().weight[eos_id].zero_()
    model.save_pretrained(folder)


def default_cache_dir() -> Path:
    return Path(os.environ.get("OWLET_CACHE_DIR", Path(__file__).resolve().parent.parent / ".cache"))


def ensure_tiny_checkpoint(family: str, cache_dir: str | Path | None = None) -> Path:
    """Return the folder of a tiny random-init checkpoint of ``family`` (a key of ``_BUILDERS``), building it once.

    The build goes to a temp folder and is renamed into place, so concurrent test processes never see a half
    written checkpoint.
    """
    if family not in _BUILDERS:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(_BUILDERS)}")
    import transformers

    key = hashlib.sha256(json.dumps([family, _TINY_VERSION, transformers.__version__]).encode()).hexdigest()[:10]
    root = Path(cache_dir or default_cache_dir()) / "tiny-models"
    final = root / f"{family}-{key}"
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{family}-", dir=root))
    try:
        _BUILDERS[family](tmp)
        try:
            tmp.rename(final)
        except OSError:  # another process won the race; its folder is complete
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final
