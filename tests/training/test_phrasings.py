"""Other forms of the demo's questions keep their answers, and recipes without them still ask the canonical forms."""

import random

from training.dialogues import QUESTION_TYPES, Turn
from training.eval import scene_examples
from training.ood import OOD_REPLY, OOD_TYPE
from training.phrasings import rephrase
from training.recipe import DEMO, RECIPES, recipe_example


def test_every_question_type_gets_other_forms_with_the_same_answer():
    examples = scene_examples(60)
    rng = random.Random(0)
    seen = {t: set() for t in QUESTION_TYPES}
    for example in examples:
        for turn in example.turns:
            for _ in range(6):
                other = rephrase(turn, rng)
                assert other.qtype == turn.qtype and other.answer == turn.answer
                assert other.question[:1].isupper() == turn.question[:1].isupper()
                seen[turn.qtype].add(other.question.lower())
    for qtype, questions in seen.items():
        assert len(questions) >= 4, (qtype, questions)
    assert any("color" in q for q in seen["colour"]) and any(not q.endswith(("?", ".")) for q in seen["count"])
    orange = {rephrase(Turn("exists", "is there a orange star?", "no"), rng).question for _ in range(40)}
    assert any("an orange star" in q for q in orange) and not any(" a orange" in q for q in orange)
    refusal = Turn(OOD_TYPE, "hello", OOD_REPLY)
    assert rephrase(refusal, rng) == refusal


def test_the_eval_can_ask_in_other_forms_on_the_same_scenes():
    plain, other = scene_examples(30), scene_examples(30, phrasings=True)
    assert [e.scene for e in plain] == [e.scene for e in other]
    assert [t.answer for e in plain for t in e.turns] == [t.answer for e in other for t in e.turns]
    changed = sum(a.question != b.question for e, f in zip(plain, other) for a, b in zip(e.turns, f.turns))
    assert changed > 0.8 * 30 * 4, "nearly every question is asked otherwise"
    assert scene_examples(30, phrasings=True)[7].turns == other[7].turns, "reproducible"


def test_a_phrasing_recipe_rephrases_and_the_demo_recipe_is_untouched():
    recipe = RECIPES["demo-phrasings"]
    assert recipe.phrasing_share > 0 and DEMO.phrasing_share == 0
    plain = [recipe_example(DEMO, i) for i in range(200)]
    varied = [recipe_example(recipe, i) for i in range(200)]
    # Same scene for the same index (the rephrasing draws come after the scene and its dialogue) ...
    assert all(a.scene == b.scene for a, b in zip(plain, varied))
    questions = [t.question.lower() for e in varied for t in e.turns]
    assert any("color" in q for q in questions) and any(q.startswith("describe this") for q in questions)
    # ... and the `demo` recipe's questions are the canonical ones only.
    canonical = {t.question.lower() for e in plain for t in e.turns if t.qtype in QUESTION_TYPES}
    assert not any("color" in q or q.startswith("describe this") for q in canonical)
