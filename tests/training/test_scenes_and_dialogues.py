"""The synthetic data is the demo model's ground truth: check that every answer follows from the scene."""

import json
import random

import pytest
import torch

from training.demo_model import describe_style_of
from training.dialogues import describe, largest, make_dialogue, position_of, to_messages
from training.examples import EVAL_SEED_BASE, IGNORE, assistant_labels, eval_dialogue, training_dialogue
from training.scenes import COLOURS, IMAGE_SIZE, Scene, Shape, generate_scene, render_scene


def _scene(*shapes: Shape) -> Scene:
    return Scene(shapes, "plain", (230, 230, 230), 0)


def test_scene_generation_and_rendering_are_deterministic():
    a, b = generate_scene(random.Random(7)), generate_scene(random.Random(7))
    assert a == b
    assert render_scene(a).tobytes() == render_scene(b).tobytes()
    assert generate_scene(random.Random(8)) != a
    for seed in range(200):
        scene = generate_scene(random.Random(seed))
        assert 1 <= len(scene.shapes) <= 4
        image = render_scene(scene)
        assert image.size == (IMAGE_SIZE, IMAGE_SIZE) and image.mode == "RGB"


def test_rendered_shape_has_its_colour_at_its_centre():
    scene = _scene(Shape("circle", "green", 60, 128, 30), Shape("square", "purple", 190, 128, 25))
    image = render_scene(scene)
    assert image.getpixel((60, 128)) == COLOURS["green"]
    assert image.getpixel((190, 128)) == COLOURS["purple"]
    assert image.getpixel((128, 20)) == (230, 230, 230)


def test_answers_follow_from_the_scene():
    for seed in range(300):
        rng = random.Random(seed)
        scene = generate_scene(rng)
        kinds = [s.kind for s in scene.shapes]
        for turn in make_dialogue(scene, rng, 6):
            q = turn.question.lower()
            if turn.qtype == "colour":
                kind = q.removeprefix("what colour is the ").removesuffix("?")
                assert kinds.count(kind) == 1, "colour asked about an ambiguous shape"
                assert turn.answer == next(s.colour for s in scene.shapes if s.kind == kind)
            elif turn.qtype == "count":
                noun = q.removeprefix("how many ").removesuffix(" are there?")
                expected = len(kinds) if noun == "shapes" else kinds.count(noun.removesuffix("s"))
                assert turn.answer == str(expected)
            elif turn.qtype == "exists":
                colour, kind = q.removeprefix("is there a ").removesuffix("?").split()
                present = any(s.colour == colour and s.kind == kind for s in scene.shapes)
                assert turn.answer == ("yes" if present else "no")
            elif turn.qtype == "where":
                kind = q.removeprefix("where is the ").removesuffix("?")
                assert turn.answer == position_of(next(s for s in scene.shapes if s.kind == kind))
            elif turn.qtype == "largest":
                big = largest(scene)
                assert big is not None and turn.answer == f"the {big.colour} {big.kind}"
            else:
                assert turn.answer == describe(scene)


def test_position_largest_and_description_rules():
    left = Shape("circle", "red", 40, 128, 20)
    right = Shape("square", "orange", 215, 120, 40)
    corner = Shape("star", "blue", 40, 40, 20)  # diagonal: no single clear answer
    assert position_of(left) == "left" and position_of(right) == "right" and position_of(corner) is None
    assert position_of(Shape("star", "blue", 128, 230, 20)) == "bottom"
    assert largest(_scene(left, right)) == right
    assert largest(_scene(left, Shape("circle", "blue", 200, 128, 21))) is None  # too close to call
    assert describe(_scene(right, corner, left)) == "a red circle, an orange square and a blue star"


def test_grouped_description_counts_twins_and_changes_nothing_else():
    twin_a, twin_b = Shape("star", "blue", 40, 40, 20), Shape("star", "blue", 200, 200, 20)
    other = Shape("circle", "orange", 40, 200, 20)
    assert describe(_scene(twin_a, other, twin_b)) == "an orange circle, a blue star and a blue star"
    assert describe(_scene(twin_a, other, twin_b), "grouped") == "an orange circle and two blue stars"
    assert describe(_scene(twin_a, twin_b), "grouped") == "two blue stars"
    assert describe(_scene(other), "grouped") == "an orange circle"
    with pytest.raises(ValueError, match="describe style"):
        describe(_scene(other), "poetic")
    # Same scenes and questions in both styles: only the answers to "describe the image." differ.
    for index in range(40):
        (scene, listed), (same_scene, grouped) = eval_dialogue(index), eval_dialogue(index, describe_style="grouped")
        assert scene == same_scene and [t.question for t in listed] == [t.question for t in grouped]
        for a, b in zip(listed, grouped):
            assert a.answer == b.answer if a.qtype != "describe" else b.answer == describe(scene, "grouped")


def test_counted_description_gives_the_number_of_shapes_then_the_listed_one():
    twin_a, twin_b = Shape("star", "blue", 40, 40, 20), Shape("star", "blue", 200, 200, 20)
    other = Shape("circle", "orange", 40, 200, 20)
    assert describe(_scene(twin_a, other, twin_b), "counted") == \
        "three shapes: an orange circle, a blue star and a blue star"
    assert describe(_scene(other), "counted") == "one shape: an orange circle"
    for index in range(40):
        (scene, listed), (same_scene, counted) = eval_dialogue(index), eval_dialogue(index, describe_style="counted")
        assert scene == same_scene and [t.question for t in listed] == [t.question for t in counted]
        for a, b in zip(listed, counted):
            assert a.answer == b.answer if a.qtype != "describe" else b.answer.endswith(": " + a.answer)


def test_a_checkpoint_is_scored_in_the_describe_style_it_was_trained_in(tmp_path):
    assert describe_style_of(tmp_path) == "listed"  # no training record: the first recipes' style
    (tmp_path / "training_summary.json").write_text(json.dumps({"recipe": {"describe_style": "grouped"}}))
    assert describe_style_of(tmp_path) == "grouped"


def test_follow_up_turns_carry_no_image_and_eval_seeds_are_disjoint():
    scene, turns = eval_dialogue(3, n_turns=4)
    messages = to_messages(render_scene(scene), turns, answered=2)
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant", "user"]
    images = [i for m in messages for i in m["content"] if i["type"] == "image"]
    assert len(images) == 1 and messages[0]["content"][0]["type"] == "image"
    assert messages[-1]["content"][0]["text"] == turns[2].question
    assert generate_scene(random.Random(EVAL_SEED_BASE)) == eval_dialogue(0)[0]
    assert training_dialogue(0)[0] != eval_dialogue(0)[0]


def test_labels_cover_assistant_replies_only():
    header, end = [7, 8, 9], 3
    ids = torch.tensor([[1, 7, 8, 9, 50, 51, 3, 4, 7, 8, 9, 60, 3, 4, 0]])
    labels = assistant_labels(ids, header, end)
    kept = labels[0][labels[0] != IGNORE].tolist()
    assert kept == [50, 51, 3, 60, 3]


def test_a_twin_scene_holds_two_shapes_of_one_kind_and_colour_and_plain_draws_are_unchanged():
    import hashlib

    from training.recipe import RECIPES, recipe_example

    for seed in range(60):
        scene = generate_scene(random.Random(seed), twins=True)
        first, second = scene.shapes[:2]
        assert 2 <= len(scene.shapes) <= 4
        assert (first.kind, first.colour) == (second.kind, second.colour) and (first.x, first.y) != (second.x, second.y)
    # The shipped weights' training data, pinned: the first 300 examples of `demo-present` (whose data
    # `demo-present-wide-grouped`, the shipped recipe, shares: width, step count and length groups draw nothing) as they were when the
    # weights were trained (the twin code and the "present" target added no RNG draw to them).
    digest = hashlib.sha256()
    for i in range(300):
        example = recipe_example(RECIPES["demo-present-wide-grouped"], i)
        digest.update(repr((example.scene, example.turns)).encode())
    assert digest.hexdigest()[:16] == "a410e9bfc9382de0", "demo-present's data changed: the card's command no longer " \
        "reproduces the shipped weights"
    # The twin recipe's pictures hold twins far more often than plain scenes (about 9 % of them).
    base, twins = RECIPES["demo-present"], RECIPES["demo-present-twins"]
    assert base.twin_share == 0 and twins.twin_share > 0
    with_twins = [recipe_example(twins, i).scene for i in range(300)]
    share = sum(len({(s.kind, s.colour) for s in scene.shapes}) < len(scene.shapes)
                for scene in with_twins if scene is not None) / sum(scene is not None for scene in with_twins)
    assert share > 0.25, share
