"""Sizes and building blocks of the demo checkpoint: tokenizer, processor and a fresh LFM2-VL model.

The pieces come from `training.tiny_checkpoint` (shared with the test fixtures); this module only fixes
the demo's sizes, so train and eval agree on them.
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from training.dialogues import make_dialogue
from training.scenes import generate_scene

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "owlet-shapes-vl"

# Scenes are 256 px, i.e. 64 image tokens; uploads of other sizes are resized to at most 64 tokens too,
# without tiling, so the demo never sees more image tokens than it was trained on.
MAX_IMAGE_TOKENS, MIN_IMAGE_TOKENS = 64, 16
TOKENIZER_VOCAB = 512
# Hybrid LFM2 text stack as in LFM2-VL-1.6B (conv blocks with a few attention layers), scaled down.
# Attention layers are the ones that read the image tokens back; conv layers only see 3 neighbours.
TEXT_SIZES = dict(
    hidden_size=160, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    layer_types=["conv", "full_attention", "conv", "full_attention"],
    block_auto_adjust_ff_dim=False, max_position_embeddings=2048,
)
VISION_SIZES = dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                    patch_size=16, num_patches=256)
PROJECTOR_HIDDEN = 192


def tokenizer_corpus(n_scenes: int = 3000, seed: int = 123, describe_style: str = "listed") -> list[str]:
    """Every word the dialogues use, in context, the refusal and the chat role names (so each is one token)."""
    from training.ood import OOD_REPLY, off_topic_question

    rng = random.Random(seed)
    texts = ["user\n", "assistant\n"] * 200
    for _ in range(n_scenes):
        scene = generate_scene(rng)
        for turn in make_dialogue(scene, rng, 5, describe_style=describe_style):
            texts += [turn.question, turn.answer]
        # The refusal is one of the most frequent answers; its words become single tokens. Off-topic questions
        # come from the training pool only (the evaluation's held-out words are spelled out in bytes).
        texts += [OOD_REPLY, off_topic_question(rng)]
    return texts


def build_processor(describe_style: str = "listed"):
    from training.tiny_checkpoint import make_lfm2vl_processor, train_tokenizer

    tokenizer = train_tokenizer(tokenizer_corpus(describe_style=describe_style), vocab_size=TOKENIZER_VOCAB)
    return make_lfm2vl_processor(tokenizer, max_image_tokens=MAX_IMAGE_TOKENS, min_image_tokens=MIN_IMAGE_TOKENS)


def describe_style_of(model_dir: Path) -> str:
    """How the checkpoint in `model_dir` answers "describe the image.": its recipe's style, as its training run
    recorded it (training_summary.json), else "listed" (the first recipes, which wrote no record of it)."""
    summary = Path(model_dir) / "training_summary.json"
    if summary.is_file():
        return json.loads(summary.read_text()).get("recipe", {}).get("describe_style", "listed")
    return "listed"


def build_fresh_model(processor, seed: int = 0, vision_width: int = VISION_SIZES["hidden_size"],
                      text_layers: tuple[str, ...] | None = None,
                      vision_layers: int = VISION_SIZES["num_hidden_layers"]):
    """A random-init demo model, saved and reloaded through from_pretrained like any checkpoint.

    `vision_width` widens the vision tower (its MLP stays twice as wide) and `vision_layers` deepens it;
    `text_layers` replaces the text stack's layer types ("conv" / "full_attention", one per layer), and so its
    depth. The text stack's widths stay fixed."""
    text_sizes = dict(TEXT_SIZES)
    if text_layers:
        text_sizes.update(layer_types=list(text_layers), num_hidden_layers=len(text_layers))
    from transformers import Lfm2VlForConditionalGeneration

    from training.tiny_checkpoint import build_lfm2vl_checkpoint

    with tempfile.TemporaryDirectory() as tmp:
        build_lfm2vl_checkpoint(tmp, tokenizer=processor.tokenizer, processor=processor, text_overrides=text_sizes,
                                vision_overrides=dict(VISION_SIZES, hidden_size=vision_width,
                                                      intermediate_size=2 * vision_width,
                                                      num_hidden_layers=vision_layers),
                                projector_hidden_size=PROJECTOR_HIDDEN, seed=seed)
        return Lfm2VlForConditionalGeneration.from_pretrained(tmp, dtype="float32")
