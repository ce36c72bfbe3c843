"""Turn scenes into training batches: chat-templated multi-turn text, image tensors, and answer-only labels.

Training seeds and evaluation seeds live in disjoint ranges, so eval scenes are always fresh.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from PIL import Image

from training.dialogues import Turn, make_dialogue, to_messages
from training.scenes import Scene, generate_scene, render_scene

EVAL_SEED_BASE = 1_000_000_000  # training example i uses seed i, and must stay below this
IGNORE = -100


def training_dialogue(index: int) -> tuple[Scene, list[Turn]]:
    """Training example `index`: a scene and 4-10 turns about it (the seed is the index).

    Long dialogues are cheap supervision: the 64 image tokens are paid once and every turn adds an answer,
    so the vision tower gets several gradients per image.
    """
    assert 0 <= index < EVAL_SEED_BASE, f"training index {index} would collide with eval seeds"
    rng = random.Random(index)
    scene = generate_scene(rng)
    return scene, make_dialogue(scene, rng, rng.randint(4, 10))


def eval_dialogue(index: int, n_turns: int = 4, describe_style: str = "listed") -> tuple[Scene, list[Turn]]:
    """Held-out example `index`: seeded from a range training never touches. The style changes only the answer
    to "describe the image." (scenes and questions are the same in every style)."""
    rng = random.Random(EVAL_SEED_BASE + index)
    scene = generate_scene(rng)
    return scene, make_dialogue(scene, rng, n_turns, describe_style=describe_style)


def assistant_labels(input_ids: torch.Tensor, header_ids: list[int], end_id: int) -> torch.Tensor:
    """Labels that keep only assistant replies (through their <|im_end|>) and ignore everything else.

    A reply starts right after the token sequence `header_ids` ("<|im_start|>assistant\\n").
    """
    labels = torch.full_like(input_ids, IGNORE)
    n = len(header_ids)
    for row, ids in enumerate(input_ids.tolist()):
        inside = False
        for i, tok in enumerate(ids):
            if inside:
                labels[row, i] = tok
                inside = tok != end_id
            elif i >= n and ids[i - n : i] == header_ids:
                labels[row, i] = tok
                inside = tok != end_id
    return labels


@dataclass(frozen=True)
class Example:
    """One training or probe conversation: its picture (None: a text-only chat), its turns, and the scene the
    picture shows (None when it is not a shape scene; the auxiliary per-token loss needs it)."""

    image: Image.Image | None
    turns: list[Turn]
    scene: Scene | None = None


def encode_batch(processor, dialogues: list[tuple[Scene, list[Turn]]]) -> dict[str, torch.Tensor]:
    """Model inputs plus `labels` for a batch of fully answered scene dialogues (right padded)."""
    return encode_examples(processor, [Example(render_scene(scene), turns, scene) for scene, turns in dialogues])


def encode_examples(processor, examples: list[Example]) -> dict[str, torch.Tensor]:
    """Model inputs plus `labels` for a batch of fully answered examples, with or without a picture."""
    images, texts = [], []
    for example in examples:
        images.append([example.image] if example.image is not None else [])
        texts.append(processor.apply_chat_template(to_messages(example.image, example.turns), tokenize=False))
    processor.tokenizer.padding_side = "right"
    if not any(images):
        images = None
    batch = processor(images=images, text=texts, padding=True, return_tensors="pt")
    tok = processor.tokenizer
    header = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    batch["labels"] = assistant_labels(batch["input_ids"], header, tok.convert_tokens_to_ids("<|im_end|>"))
    batch["labels"][batch["attention_mask"] == 0] = IGNORE
    return dict(batch)
