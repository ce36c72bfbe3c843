"""Multi-turn question/answer dialogues about a `Scene`, with short canonical answers.

Answers are a closed, tiny language ("red", "2", "left", "yes", "the red circle",
"a red circle and a blue square") so that exact match is a meaningful score. A question is only asked
when its answer is unambiguous in the scene (e.g. "what colour is the circle?" needs exactly one circle).
The image is attached to the first user turn only, so every follow-up must be answered from that image.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from PIL import Image

from training.scenes import COLOUR_NAMES, IMAGE_SIZE, SHAPES, Scene, Shape

QUESTION_TYPES = ("colour", "count", "where", "exists", "largest", "describe")
PLURALS = {"circle": "circles", "square": "squares", "triangle": "triangles", "star": "stars"}
NUMBER_WORDS = ("0", "1", "2", "3", "4")

_POSITION_DOMINANCE = 1.5  # one axis must dominate the other by this much for "where" to be asked
_POSITION_MIN_OFFSET = 0.2  # ...and be this far from the centre (fraction of half the image)
_LARGEST_RATIO = 1.5  # the largest shape must beat the runner-up's area by this much


@dataclass(frozen=True)
class Turn:
    qtype: str  # one of QUESTION_TYPES
    question: str
    answer: str


def position_of(shape: Shape) -> str | None:
    """'left', 'right', 'top' or 'bottom' when clear-cut, else None (the question is then not asked)."""
    half = IMAGE_SIZE / 2
    dx, dy = (shape.x - half) / half, (shape.y - half) / half
    if abs(dx) >= _POSITION_DOMINANCE * abs(dy) and abs(dx) >= _POSITION_MIN_OFFSET:
        return "left" if dx < 0 else "right"
    if abs(dy) >= _POSITION_DOMINANCE * abs(dx) and abs(dy) >= _POSITION_MIN_OFFSET:
        return "top" if dy < 0 else "bottom"
    return None


# How "describe the image." is answered. All list shapes sorted by kind, then colour:
# - "listed" names each shape: "a red circle, a blue star and a blue star";
# - "grouped" names each kind-and-colour once, with its count: "a red circle and two blue stars". Twins are the
#   "listed" answers' most common miss (one of two identical phrases dropped or repeated), and the count says up
#   front how many to write.
# - "counted" is "listed" after the number of shapes: "three shapes: a red circle, a blue star and a blue star".
#   Most "listed" misses have the wrong number of items (a well-separated shape written twice, or one left out),
#   while "how many shapes are there?" is answered right far more often; written first, the number is in the
#   context while the list is written, and says when to stop.
DESCRIBE_STYLES = ("listed", "grouped", "counted")
_COUNT_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}


def describe(scene: Scene, style: str = "listed") -> str:
    """Canonical description of the scene in `style` (one of DESCRIBE_STYLES)."""
    if style not in DESCRIBE_STYLES:
        raise ValueError(f"describe style {style!r} is not one of {DESCRIBE_STYLES}")
    order = sorted(scene.shapes, key=lambda s: (SHAPES.index(s.kind), COLOUR_NAMES.index(s.colour)))
    if style in ("listed", "counted"):
        parts = [f"{'an' if s.colour == 'orange' else 'a'} {s.colour} {s.kind}" for s in order]
    else:
        counts: dict[tuple[str, str], int] = {}
        for s in order:  # dicts keep insertion order, so the groups stay sorted
            counts[(s.colour, s.kind)] = counts.get((s.colour, s.kind), 0) + 1
        parts = [f"{'an' if colour == 'orange' else 'a'} {colour} {kind}" if n == 1
                 else f"{_COUNT_WORDS[n]} {colour} {PLURALS[kind]}" for (colour, kind), n in counts.items()]
    listing = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    if style == "counted":
        n = len(scene.shapes)
        return f"{_COUNT_WORDS[n]} shape{'s' if n > 1 else ''}: {listing}"
    return listing


def largest(scene: Scene) -> Shape | None:
    if len(scene.shapes) < 2:
        return None
    first, second = sorted(scene.shapes, key=lambda s: -s.area)[:2]
    return first if first.area >= _LARGEST_RATIO * second.area else None


def _unique_kinds(scene: Scene) -> list[str]:
    kinds = [s.kind for s in scene.shapes]
    return [k for k in SHAPES if kinds.count(k) == 1]


def _shape_of_kind(scene: Scene, kind: str) -> Shape:
    return next(s for s in scene.shapes if s.kind == kind)


def candidate_turns(scene: Scene, rng: random.Random, describe_style: str = "listed",
                    independent_exists: bool = False) -> dict[str, list[Turn]]:
    """Every askable question for the scene, grouped by type (some types may have none).

    "is there" questions come as one "yes" and one "no" per scene; with `independent_exists` each of the two
    is "yes" or "no" by its own coin, so two questions in one chat can share their answer and the second cannot be
    answered as the opposite of the first (training/eval.py's `--exists-pairs` measures that shortcut)."""
    out: dict[str, list[Turn]] = {t: [] for t in QUESTION_TYPES}
    for kind in _unique_kinds(scene):
        shape = _shape_of_kind(scene, kind)
        out["colour"].append(Turn("colour", f"what colour is the {kind}?", shape.colour))
        where = position_of(shape)
        if where:
            out["where"].append(Turn("where", f"where is the {kind}?", where))
    kinds = [s.kind for s in scene.shapes]
    for kind in SHAPES:
        out["count"].append(Turn("count", f"how many {PLURALS[kind]} are there?", NUMBER_WORDS[kinds.count(kind)]))
    out["count"].append(Turn("count", "how many shapes are there?", NUMBER_WORDS[len(kinds)]))
    present = sorted({(s.colour, s.kind) for s in scene.shapes})
    for answer in ("yes", "no"):
        if independent_exists:
            yes_left = len(present) > sum(t.answer == "yes" for t in out["exists"])  # one-shape scenes: one yes
            answer = "yes" if rng.random() < 0.5 and yes_left else "no"
        out["exists"].append(exists_question(present, rng, answer, asked=out["exists"]))
    big = largest(scene)
    if big:
        out["largest"].append(Turn("largest", "which shape is the largest?", f"the {big.colour} {big.kind}"))
    out["describe"].append(Turn("describe", "describe the image.", describe(scene, describe_style)))
    return out


def exists_question(present: list[tuple[str, str]], rng: random.Random, answer: str,
                    asked: list[Turn] = ()) -> Turn:
    """An "is there a <colour> <kind>?" question about a scene whose (colour, kind) pairs are `present` (sorted),
    answered `answer`, and not one of the turns `asked` already. A "no" is a hard negative 70 % of the time: it
    keeps either the colour or the kind of a shape that is present."""
    taken = {t.question for t in asked}
    fresh = [(c, k) for c, k in (present if answer == "yes" else
                                 [(c, k) for c in COLOUR_NAMES for k in SHAPES if (c, k) not in present])
             if f"is there a {c} {k}?" not in taken]
    if answer == "no":
        near = [(c, k) for c, k in fresh if any(c == pc or k == pk for pc, pk in present)]
        fresh = near if near and rng.random() < 0.7 else fresh
    colour, kind = rng.choice(fresh)
    return Turn("exists", f"is there a {colour} {kind}?", answer)


def make_dialogue(scene: Scene, rng: random.Random, n_turns: int,
                  type_weights: dict[str, float] | None = None, describe_style: str = "listed",
                  independent_exists: bool = False) -> list[Turn]:
    """Up to n_turns distinct questions about the scene, question types drawn as evenly as the scene allows.

    `type_weights` (training only) makes some types likelier where the scene allows them; without it the draw
    is uniform over the available types, which is what evaluation uses. `describe_style` is how "describe the
    image." is answered (DESCRIBE_STYLES); the questions and every other answer are the same in both.
    """
    pool = candidate_turns(scene, rng, describe_style, independent_exists)
    for turns in pool.values():
        rng.shuffle(turns)
    dialogue: list[Turn] = []
    while len(dialogue) < n_turns:
        types = [t for t in QUESTION_TYPES if pool[t]]
        if not types:
            break
        if type_weights:
            qtype = rng.choices(types, weights=[type_weights.get(t, 1.0) for t in types])[0]
        else:
            qtype = rng.choice(types)
        turn = pool[qtype].pop()
        if rng.random() < 0.5:  # users type "What ..." as often as "what ..."; both must work
            turn = Turn(turn.qtype, turn.question[0].upper() + turn.question[1:], turn.answer)
        dialogue.append(turn)
    return dialogue


def to_messages(image: Image.Image | None, turns: list[Turn], answered: int | None = None) -> list[dict]:
    """HF chat messages: the image rides on the first user turn; the first `answered` turns carry answers.

    With answered=None every turn is answered (a training example); with answered=k the chat ends on the
    (k+1)-th question, ready for generation.
    """
    answered = len(turns) if answered is None else answered
    messages: list[dict] = []
    for i, turn in enumerate(turns[: answered + 1]):
        content = [{"type": "text", "text": turn.question}]
        if i == 0 and image is not None:
            content.insert(0, {"type": "image", "image": image})
        messages.append({"role": "user", "content": content})
        if i < answered:
            messages.append({"role": "assistant", "content": [{"type": "text", "text": turn.answer}]})
    return messages
