"""The one-command recipe's data: deterministic, mixed as documented, with honest out-of-domain probes."""

import json

import pytest
import torch
from PIL import Image

from training.dialogues import QUESTION_TYPES, describe, position_of
from training.example_scenes import EXAMPLES, EXAMPLES_DIR
from training.examples import IGNORE, encode_examples
from training.ood import (_EVAL_FRAMES, _EVAL_NOUNS, _EVAL_THINGS, _TRAIN_FRAMES, _TRAIN_NOUNS, _TRAIN_THINGS, IMAGE_KINDS,
                          OOD_REPLY, OOD_TYPE, ood_image)
from training.recipe import DEMO, RECIPES, ood_probe, probe_family, recipe_example
from training.scenes import render_scene


def _same(a, b) -> bool:
    same_image = (a.image is None and b.image is None) or a.image.tobytes() == b.image.tobytes()
    return same_image and a.turns == b.turns and a.scene == b.scene


def test_recipe_examples_are_reproducible_and_mixed():
    assert _same(recipe_example(DEMO, 123), recipe_example(DEMO, 123))
    examples = [recipe_example(DEMO, i) for i in range(600)]
    non_scene = [e for e in examples if e.scene is None]
    text_only = [e for e in non_scene if e.image is None]
    assert 0.07 < len(non_scene) / len(examples) < 0.2 and text_only
    for e in non_scene:  # a picture that is not a scene, or none: every turn gets the refusal
        assert e.turns and all(t.answer == OOD_REPLY and t.qtype == OOD_TYPE for t in e.turns)
    scenes = [e for e in examples if e.scene is not None]
    assert all(e.image.tobytes() == render_scene(e.scene).tobytes() for e in scenes[:20])
    mixed = [e for e in scenes if any(t.qtype == OOD_TYPE for t in e.turns)]
    assert 0.15 < len(mixed) / len(scenes) < 0.35, "some scene dialogues carry off-topic turns"
    assert all(any(t.qtype != OOD_TYPE for t in e.turns) for e in mixed)
    counts = {q: sum(t.qtype == q for e in scenes for t in e.turns) for q in QUESTION_TYPES}
    assert counts["where"] > 0.1 * sum(counts.values()), f"'where' is drawn more often in training: {counts}"


def test_a_grouped_recipe_answers_describe_grouped_and_its_tokenizer_knows_the_count_words():
    from training.demo_model import build_processor

    grouped = RECIPES["demo-grouped-wide"]
    answers = [(e.scene, t.answer) for e in (recipe_example(grouped, i) for i in range(300)) if e.scene is not None
               for t in e.turns if t.qtype == "describe"]
    assert answers and all(answer == describe(scene, "grouped") for scene, answer in answers)
    assert any(" two " in f" {answer} " for _, answer in answers), "twins appear, counted"
    tokenizer = build_processor("grouped").tokenizer
    assert len(tokenizer.encode("two blue stars", add_special_tokens=False)) <= 4


def test_ood_images_look_like_uploads_not_scenes():
    import random

    rng = random.Random(5)
    sizes = set()
    for kind in IMAGE_KINDS:
        for _ in range(3):
            image = ood_image(rng, kind)
            assert image.mode == "RGB" and min(image.size) >= 64
            sizes.add(image.size)
    assert len(sizes) > 5, "upload-like pictures come in many sizes"


def test_probes_are_held_out_and_cover_every_family():
    probes = [ood_probe(i) for i in range(14)]
    assert {probe_family(i) for i in range(14)} == {*IMAGE_KINDS, "scene+off-topic", "no-image"}
    assert all(t.answer == OOD_REPLY for p in probes for t in p.turns)
    # Evaluation questions come from a pool training never saw: shared sentence frames are only the near misses
    # ("where is the {noun}?"), and those are filled with nouns and topics training never uses.
    assert all("{noun" in frame for frame in set(_TRAIN_FRAMES) & set(_EVAL_FRAMES))
    assert not set(_TRAIN_NOUNS) & set(_EVAL_NOUNS) and not set(_TRAIN_THINGS) & set(_EVAL_THINGS)
    train_questions = {t.question.lower() for i in range(2000) for t in recipe_example(DEMO, i).turns
                       if t.qtype == OOD_TYPE}
    probe_off_topic = [t.question.lower() for i in range(200) for t in ood_probe(i).turns
                       if probe_family(i) in ("scene+off-topic", "no-image")]
    overlap = [q for q in probe_off_topic if q in train_questions]
    assert len(overlap) <= 0.05 * len(probe_off_topic), overlap[:5]


def test_batches_mix_pictures_scenes_and_text_only_chats():
    from training.demo_model import build_processor

    processor = build_processor()
    examples = [recipe_example(DEMO, i) for i in range(40)]
    picked = [next(e for e in examples if e.scene is not None), next(e for e in examples if e.image is None),
              next(e for e in examples if e.image is not None and e.scene is None)]
    batch = encode_examples(processor, picked)
    assert batch["pixel_values"].shape[0] == 2, "one image each for the scene and the non-scene picture"
    reply = processor.tokenizer.encode(OOD_REPLY, add_special_tokens=False)
    assert len(reply) <= 12, "the refusal is a handful of tokens in the demo vocabulary"
    labels = batch["labels"][1][batch["labels"][1] != IGNORE].tolist()
    assert processor.tokenizer.decode(labels).count(OOD_REPLY) == len(picked[1].turns)


def test_bundled_examples_match_their_scenes():
    manifest = json.loads((EXAMPLES_DIR / "examples.json").read_text())
    assert [m["file"] for m in manifest] == [f"{name}.png" for name in EXAMPLES]
    for item, (name, (scene, turn)) in zip(manifest, EXAMPLES.items()):
        assert item["question"] == turn.question
        png = Image.open(EXAMPLES_DIR / item["file"]).convert("RGB")
        assert png.tobytes() == render_scene(scene).tobytes(), f"{name}.png is stale: python -m training.example_scenes"
        if turn.qtype == "describe":
            assert turn.answer == describe(scene)
        if turn.qtype == "where":
            kind = turn.question.lower().removeprefix("where is the ").removesuffix("?")
            assert turn.answer == position_of(next(s for s in scene.shapes if s.kind == kind))
        if turn.qtype == "count":
            kind = turn.question.lower().removeprefix("how many ").removesuffix("s are there?")
            assert turn.answer == str(sum(s.kind == kind for s in scene.shapes))


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_token_probe_ignores_pictures_that_are_not_scenes(recipe):
    from training.demo_model import build_fresh_model, build_processor
    from training.train import TokenProbe

    processor = build_processor()
    model = build_fresh_model(processor)
    probe = TokenProbe(model, RECIPES[recipe].aux_targets)
    assert set(probe.heads) == {*RECIPES[recipe].aux_targets, "row", "col"}
    examples = [recipe_example(DEMO, i) for i in range(40)]
    scene = next(e for e in examples if e.scene is not None)
    other = next(e for e in examples if e.image is not None and e.scene is None)
    with torch.no_grad():
        model(**{k: v for k, v in encode_examples(processor, [scene, other]).items() if k != "labels"})
        both = probe.loss([scene.scene, None])
        model(**{k: v for k, v in encode_examples(processor, [scene]).items() if k != "labels"})
        alone = probe.loss([scene.scene])
    assert torch.isfinite(both) and torch.allclose(both, alone, atol=1e-4), (both, alone)


def test_a_fading_target_weighs_in_fully_then_fades_out_of_the_loss():
    from training.demo_model import build_fresh_model, build_processor
    from training.recipe import DEMO_WHERE_FADE
    from training.train import TokenProbe

    recipe = DEMO_WHERE_FADE
    start, end = recipe.fade_window
    assert recipe.target_scale("where", 0.0) == recipe.target_scale("where", start) == 1.0
    assert recipe.target_scale("where", (start + end) / 2) == pytest.approx(0.5)
    assert recipe.target_scale("where", end) == recipe.target_scale("where", 1.0) == 0.0
    assert recipe.target_scale("kind", 1.0) == 1.0 and DEMO.target_scale("where", 1.0) == 1.0
    processor = build_processor()
    model = build_fresh_model(processor)
    probe = TokenProbe(model, recipe.aux_targets)
    scene = next(e for e in (recipe_example(recipe, i) for i in range(40)) if e.scene is not None)
    with torch.no_grad():
        model(**{k: v for k, v in encode_examples(processor, [scene]).items() if k != "labels"})
        full, half, gone = (probe.loss([scene.scene], {"where": w}) for w in (1.0, 0.5, 0.0))
    without = TokenProbe(model, ("kind", "colour"))
    without.heads.load_state_dict({k: v for k, v in probe.heads.state_dict().items() if not k.startswith("where")})
    with torch.no_grad():
        model(**{k: v for k, v in encode_examples(processor, [scene]).items() if k != "labels"})
        base = without.loss([scene.scene])
    where = full - base
    assert where > 0
    torch.testing.assert_close(half, base + 0.5 * where, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gone, base, rtol=1e-5, atol=1e-5)


def test_a_recipe_can_deepen_either_stack_and_the_default_stays_the_shipped_one():
    from training.demo_model import TEXT_SIZES, VISION_SIZES, build_fresh_model, build_processor
    from training.recipe import DEMO_DEEP_TEXT, DEMO_DEEP_VISION, DEMO_PHRASINGS

    processor = build_processor()
    deep_text = build_fresh_model(processor, text_layers=DEMO_DEEP_TEXT.text_layers).config
    assert deep_text.text_config.layer_types == list(DEMO_DEEP_TEXT.text_layers)
    assert deep_text.text_config.num_hidden_layers == 5
    deep_vision = build_fresh_model(processor, vision_layers=DEMO_DEEP_VISION.vision_layers).config
    assert deep_vision.vision_config.num_hidden_layers == 5
    shipped = build_fresh_model(processor).config
    assert DEMO_PHRASINGS.text_layers is None and DEMO_PHRASINGS.vision_layers == VISION_SIZES["num_hidden_layers"]
    assert shipped.text_config.layer_types == TEXT_SIZES["layer_types"]
    assert (shipped.text_config.num_hidden_layers, shipped.vision_config.num_hidden_layers) == (4, 3)
    # depth only: the widths stay the demo's
    assert deep_text.text_config.hidden_size == shipped.text_config.hidden_size
    assert deep_vision.vision_config.hidden_size == shipped.vision_config.hidden_size


def test_weight_average_follows_the_decay_from_its_first_update_and_leaves_training_alone():
    from training.train import WeightAverage

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))
    average = WeightAverage(decay=0.75)
    steps = [1.0, 5.0, 9.0]
    with torch.no_grad():
        for value in steps:
            for p in model.parameters():
                p.fill_(value)
            average.update(model)
    assert all(torch.all(p == 9.0) for p in model.parameters()), "updating the average never touches the model"
    expected = (1.0 * 0.75 + 5.0 * 0.25) * 0.75 + 9.0 * 0.25  # starts at the first update's weights
    average.copy_to(model)
    assert all(torch.allclose(p, torch.full_like(p, expected)) for p in model.parameters())
    assert RECIPES["demo-present-ema"].ema_decay > 0 and RECIPES["demo-present"].ema_decay == 0


def test_length_groups_give_the_whole_batchs_loss_and_gradients():
    """training/length_groups.py: a step computed in length groups is the same step, less the padding."""
    from training.demo_model import build_fresh_model, build_processor
    from training.length_groups import length_groups
    from training.recipe import DEMO_PRESENT_WIDE_GROUPED as recipe
    from training.train import TokenProbe, _answer_loss

    processor = build_processor()
    model = build_fresh_model(processor)
    probe = TokenProbe(model, recipe.aux_targets)
    examples = [recipe_example(recipe, i) for i in range(16)]
    assert any(e.image is None for e in examples) and any(e.scene is not None for e in examples)
    batch = encode_examples(processor, examples)
    parts = length_groups(batch, [e.image is not None for e in examples], 3)
    assert sorted(i for members, _ in parts for i in members) == list(range(16))
    computed = sum(part["input_ids"].numel() for _, part in parts)
    assert computed < batch["input_ids"].numel(), "grouping computed as much padding as the whole batch"
    results = {}
    for groups in (1, 3):
        model.zero_grad()
        loss, scenes = _answer_loss(model, probe, dict(batch), examples, groups)
        aux = probe.loss(scenes)
        (loss + aux).backward()
        results[groups] = (loss.detach(), aux.detach(),
                           {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    (loss1, aux1, grads1), (loss3, aux3, grads3) = results[1], results[3]
    torch.testing.assert_close(loss3, loss1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(aux3, aux1, rtol=1e-5, atol=1e-5)
    assert grads1.keys() == grads3.keys() and len(grads1) > 50
    for name in grads1:
        torch.testing.assert_close(grads3[name], grads1[name], rtol=1e-3, atol=1e-5, msg=name)
