"""Out-of-domain data: pictures that are not shape scenes and questions the demo model cannot answer.

The demo model knows one tiny world (training/scenes.py) and one closed question language
(training/dialogues.py). Everything else gets one short honest reply, `OOD_REPLY`. This module makes the
negatives that teach it: images that are not scenes (blank, gradients, noise, blurry photo-like fields, text),
at the sizes users upload, and questions outside the language (other topics, greetings, near misses such as
"what colour is the dog?").

Training and evaluation draw from disjoint pools: the evaluation's off-topic questions use words and sentence
frames training never saw, and its images come from seeds training never uses, so `ood_reply_rate` measures
generalisation, not recall.
"""

from __future__ import annotations

import random

from PIL import Image, ImageDraw, ImageFilter, ImageFont

from training.dialogues import Turn

OOD_REPLY = "I only know about shapes in pictures like the examples."
OOD_TYPE = "ood"
IMAGE_KINDS = ("blank", "gradient", "noise", "photo", "text")

# Off-topic questions are built from frames and fillers; training and evaluation use disjoint lists.
_TRAIN_FRAMES = (
    "what is {thing}?", "tell me about {thing}.", "can you explain {thing}?", "who invented {thing}?",
    "write a poem about {thing}.", "is {thing} good for you?", "what colour is the {noun}?",
    "how many {nouns} are there?", "where is the {noun}?", "is there a {noun}?", "what is the {noun} doing?",
    "what animal is this?", "what is this?", "what is in this picture?", "who is this?", "hello", "hi!",
    "thanks", "who are you?", "what can you do?", "how old is the {noun}?", "what time is it?",
    "what is {a} plus {b}?", "translate {thing} into french.", "what does the text say?", "read the sign.",
    "is this a photo?", "what is the weather like?", "summarise this document.", "help me with my homework.",
)
_TRAIN_THINGS = ("the moon", "python", "gravity", "music", "coffee", "the internet", "paris", "a car", "love",
                 "history", "football", "money", "the ocean", "bread", "electricity", "chess")
_TRAIN_NOUNS = ("dog", "cat", "car", "tree", "house", "person", "bird", "hexagon", "flower", "boat", "sun", "horse")
_EVAL_FRAMES = (
    "could you describe {thing} to me?", "why is {thing} important?", "what do you think of {thing}?",
    "what colour is the {noun}?", "how many {nouns} can you see?", "where is the {noun}?", "is this a {noun}?",
    "what breed is this {noun}?", "good morning!", "what is your name?", "who made you?",
    "how do i cook {thing}?", "what is {a} times {b}?", "what language is this?", "is it going to rain?",
    "what brand is this?", "what emotion does this show?", "give me a recipe.", "what city is this?",
    "please summarise the picture in detail.",
)
_EVAL_THINGS = ("the sun", "rice", "quantum physics", "a bicycle", "the weather", "pasta", "a volcano", "jazz",
                "tennis", "democracy")
_EVAL_NOUNS = ("rabbit", "pentagon", "baby", "building", "plane", "cow", "elephant", "mountain", "apple", "chair")
_PLURAL = {"person": "people", "sheep": "sheep"}


def _plural(noun: str) -> str:
    return _PLURAL.get(noun, noun + "s")


def off_topic_question(rng: random.Random, held_out: bool = False) -> str:
    """A question outside the demo's language; `held_out` draws from the evaluation's disjoint pool."""
    frames, things, nouns = (_EVAL_FRAMES, _EVAL_THINGS, _EVAL_NOUNS) if held_out else (
        _TRAIN_FRAMES, _TRAIN_THINGS, _TRAIN_NOUNS)
    noun = rng.choice(nouns)
    question = rng.choice(frames).format(thing=rng.choice(things), noun=noun, nouns=_plural(noun),
                                         a=rng.randint(1, 20), b=rng.randint(1, 20))
    return question[0].upper() + question[1:] if rng.random() < 0.5 else question


def refusal(question: str) -> Turn:
    return Turn(OOD_TYPE, question, OOD_REPLY)


def _size(rng: random.Random) -> tuple[int, int]:
    """Upload-like sizes: square or not, small or large (the processor shrinks them to at most 64 tokens)."""
    if rng.random() < 0.3:
        side = rng.choice((128, 224, 256, 320, 512))
        return side, side
    return rng.randint(96, 640), rng.randint(96, 640)


def _colour(rng: random.Random) -> tuple[int, int, int]:
    return tuple(rng.randint(0, 255) for _ in range(3))


def _gradient(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    a, b = _colour(rng), _colour(rng)
    ramp = Image.linear_gradient("L").rotate(rng.choice((0, 90, 180, 270)))
    if rng.random() < 0.3:
        ramp = Image.radial_gradient("L")
    return Image.composite(Image.new("RGB", (256, 256), a), Image.new("RGB", (256, 256), b), ramp).resize(size)


def _noise(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """Pixel noise at a random grain: fine static or coarse blocks."""
    grain = rng.choice((1, 2, 4, 8, 16))
    w, h = max(1, size[0] // grain), max(1, size[1] // grain)
    data = bytes(rng.getrandbits(8) for _ in range(w * h * 3))
    return Image.frombytes("RGB", (w, h), data).resize(size, Image.NEAREST)


def _photo(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """Photo-like: a smooth colour field with soft, blurred blobs and sensor grain (no flat shapes)."""
    w, h = 6, 6
    field = Image.frombytes("RGB", (w, h), bytes(rng.randint(20, 235) for _ in range(w * h * 3)))
    image = field.resize(size, Image.BICUBIC)
    draw = ImageDraw.Draw(image)
    for _ in range(rng.randint(2, 8)):
        cx, cy = rng.uniform(0, size[0]), rng.uniform(0, size[1])
        rx, ry = rng.uniform(10, size[0] / 2), rng.uniform(10, size[1] / 2)
        draw.ellipse([cx - rx, cy - ry, cx + rx, cy + ry], fill=_colour(rng))
    image = image.filter(ImageFilter.GaussianBlur(rng.uniform(4, 14)))
    grain = Image.effect_noise(size, rng.uniform(10, 40)).convert("RGB")
    return Image.blend(image, grain, rng.uniform(0.05, 0.2))


_WORDS = ("the", "owl", "report", "menu", "invoice", "hello", "world", "total", "page", "chapter", "price",
          "meeting", "notes", "open", "daily", "news", "score", "team", "road", "closed", "sale", "2024", "42")


def _text(rng: random.Random, size: tuple[int, int]) -> Image.Image:
    """A rendered page, sign or screenshot: lines of words on a plain background."""
    light = rng.random() < 0.7
    background = tuple(rng.randint(200, 255) for _ in range(3)) if light else tuple(rng.randint(0, 60) for _ in range(3))
    ink = tuple(rng.randint(0, 80) for _ in range(3)) if light else tuple(rng.randint(180, 255) for _ in range(3))
    image = Image.new("RGB", size, background)
    draw = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=rng.randint(12, 40))
    y = rng.randint(0, 20)
    while y < size[1]:
        line = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 6)))
        draw.text((rng.randint(0, 30), y), line, fill=ink, font=font)
        y += font.size + rng.randint(4, 20)
    return image


def ood_image(rng: random.Random, kind: str | None = None) -> Image.Image:
    """A picture that is not a shape scene, of kind `kind` (one of IMAGE_KINDS, or a random one)."""
    kind = kind or rng.choice(IMAGE_KINDS)
    size = _size(rng)
    if kind == "blank":
        return Image.new("RGB", size, _colour(rng))
    return {"gradient": _gradient, "noise": _noise, "photo": _photo, "text": _text}[kind](rng, size)
