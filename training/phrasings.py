"""Other ways users ask the demo's questions: "What color is the circle?", "how many squares?", "describe this image".

The dialogues (training/dialogues.py) ask each question in one canonical form, and a model trained on those alone
refuses the same question asked otherwise: "What color is the circle?" (American spelling) or "Describe the
image" (no full stop) got "I only know about shapes ...". A recipe with `phrasing_share` > 0 rewrites that share
of its questions into one of the forms below, with the same answer; `training.eval --phrasings` scores a
checkpoint on held-out scenes with every question rewritten.

The forms avoid the held-out off-topic frames of training/ood.py ("how many {nouns} can you see?", "is this a
{noun}?"), so the out-of-domain probes still test generalisation, not a frame this module taught.
"""

from __future__ import annotations

import random
import re

from training.dialogues import Turn

# qtype -> (pattern over the canonical lower-case question, alternative forms using its named groups)
_FORMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "colour": (r"what colour is the (?P<kind>\w+)\?", (
        "what color is the {kind}?", "which colour is the {kind}?", "what colour is the {kind} in the picture?",
        "what is the colour of the {kind}?", "which color is the {kind}?")),
    "count": (r"how many (?P<things>\w+) are there\?", (
        "how many {things}?", "how many {things} are in the picture?", "how many {things} are there in the image?",
        "count the {things}.")),
    "where": (r"where is the (?P<kind>\w+)\?", (
        "where's the {kind}?", "where is the {kind} located?", "where is the {kind} in the picture?",
        "on which side is the {kind}?")),
    "exists": (r"is there a (?P<colour>\w+) (?P<kind>\w+)\?", (
        "is there {article} {colour} {kind}?", "do you see {article} {colour} {kind}?",
        "is there any {colour} {kind}?", "can you see {article} {colour} {kind}?",
        "is there {article} {colour} {kind} in the picture?")),
    "largest": (r"which shape is the largest\?", (
        "which shape is the biggest?", "what is the largest shape?", "which is the biggest shape?",
        "which shape is largest?")),
    "describe": (r"describe the image\.", (
        "describe this image.", "describe the picture.", "what shapes are there?", "what shapes do you see?",
        "describe what you see.")),
}


def rephrase(turn: Turn, rng: random.Random) -> Turn:
    """The same question in another form (same answer), then maybe "color" for "colour" and no final mark.
    Turns of other types (the refusals) come back unchanged."""
    if turn.qtype not in _FORMS:
        return turn
    pattern, forms = _FORMS[turn.qtype]
    match = re.fullmatch(pattern, turn.question.lower())
    assert match is not None, f"not a canonical {turn.qtype} question: {turn.question!r}"
    fields = match.groupdict()
    fields["article"] = "an" if fields.get("colour") == "orange" else "a"
    question = rng.choice(forms).format(**fields)
    if rng.random() < 0.5:
        question = question.replace("colour", "color")
    if rng.random() < 0.3:
        question = question.rstrip("?.")
    if turn.question[:1].isupper():
        question = question[0].upper() + question[1:]
    return Turn(turn.qtype, question, turn.answer)
