"""The shipped demo checkpoint: loads offline like any checkpoint, fits the size budget, and answers well.

The quality gate is the fast check: >= 98 % exact match (the overall target) on 100 fresh held-out scenes (4 turns
each, the image on the first turn only), and as much with every question asked in another form. The shipped weights
score 0.99 on both. The full 500-scene figures are in the model card.
"""

import torch

from training.demo_model import describe_style_of
from training.eval import evaluate, load

MAX_CHECKPOINT_BYTES = 25 * 1024 * 1024


def test_checkpoint_is_complete_and_small(demo_model_dir):
    names = {p.name for p in demo_model_dir.iterdir()}
    for required in ("config.json", "model.safetensors", "tokenizer.json", "processor_config.json", "README.md"):
        assert required in names, f"{required} missing from {demo_model_dir}"
    total = sum(p.stat().st_size for p in demo_model_dir.rglob("*") if p.is_file())
    assert total <= MAX_CHECKPOINT_BYTES, f"checkpoint is {total / 2**20:.1f} MiB, over the 25 MiB budget"


def test_accuracy_on_100_held_out_scenes(demo_model_dir, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(2)
    model, processor = load(demo_model_dir)
    assert type(model).__name__ == "Lfm2VlForConditionalGeneration"
    report = evaluate(model, processor, scenes=100, batch_size=100, describe_style=describe_style_of(demo_model_dir))
    assert report["questions"] == 400
    assert report["accuracy"] >= 0.98, f"accuracy {report['accuracy']:.3f}; misses: {report['failures'][:5]}"


def test_questions_asked_in_other_forms_are_answered(demo_model_dir, monkeypatch):
    """ "What color is the circle?", "how many squares?", "describe this image": the forms users type (the
    weights before these refused 56 % of them and scored 0.213)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(2)
    model, processor = load(demo_model_dir)
    report = evaluate(model, processor, scenes=100, batch_size=100, phrasings=True,
                      describe_style=describe_style_of(demo_model_dir))
    assert report["accuracy"] >= 0.98, f"accuracy {report['accuracy']:.3f}; misses: {report['failures'][:5]}"
    assert report["in_domain_refusal_rate"] <= 0.01, [f for f in report["failures"] if "only know" in f["got"]][:5]


def test_a_second_is_there_question_is_answered_from_the_picture(demo_model_dir, monkeypatch):
    """Two "is there" questions with the same answer in one chat (both yes or both no): the weights before these
    answered the second as the opposite of the first (turn 2: 0.406 on 500 scenes), since every training chat that
    asked two paired one yes with one no."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(2)
    model, processor = load(demo_model_dir)
    report = evaluate(model, processor, scenes=100, batch_size=100, exists_pairs=True)
    assert report["questions"] == 200
    assert report["per_turn"][2] >= 0.98, f"turn 2 {report['per_turn'][2]:.3f}; misses: {report['failures'][:5]}"
