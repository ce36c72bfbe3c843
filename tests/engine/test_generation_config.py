"""A checkpoint's generation_config.json: the rules the model's own generate() applies to every answer, greedy too.

Qwen2-VL and Qwen2.5-VL ship a repetition penalty (1.05): without it, Owlet's greedy answers differed from the model's
own generate(). The tiny checkpoints ship none, so here one is set on the loaded model's generation config (what
from_pretrained reads from generation_config.json), strong enough to change the tiny models' answers."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine import EngineConfig, SamplingParams, greedy
from engine.models.model_runner import ModelRunner
from engine.models.reference_run import reference_run
from training.tiny_checkpoint import ensure_tiny_checkpoint

from .helpers import chat, image, run_until_done

PENALTY = 1.8
# the slot batch's two families, and the dynamic batch's M-RoPE families that ship a penalty in their real checkpoints
FAMILIES = ["lfm2vl", "llava", "qwen2vl", "qwen2_5vl"]


@pytest.fixture(params=FAMILIES)
def family(request):
    return request.param


def reference_tokens(runner, messages, n: int, **generate_kwargs) -> list[int]:
    """The model's own generate(), greedy, with the checkpoint's generation config unless overridden."""
    inputs = runner.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                  return_dict=True, return_tensors="pt")
    with torch.inference_mode(), reference_run():
        out = runner.model.generate(**inputs, max_new_tokens=n, do_sample=False, **generate_kwargs)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


@pytest.fixture
def penalised(runners, family):
    """The family's shared runner with PENALTY in its generation config, as loaded from a checkpoint that ships it."""
    runner = runners(family)
    config, before = runner.model.generation_config, (runner.model.generation_config.repetition_penalty,
                                                     runner.repetition_penalty)
    config.repetition_penalty = runner.repetition_penalty = PENALTY
    yield runner
    config.repetition_penalty, runner.repetition_penalty = before


def test_the_checkpoints_repetition_penalty_is_applied_as_generate_applies_it(family, penalised, make_engine):
    engine = make_engine(family, max_running=3)
    asked = [(chat("Describe the image in detail, please.", image(1)), 24, None),
             (chat("Tell me a story about owls. " * 3), 20, None),
             (chat("What colour is it?", image(2, (80, 64))), 18, 1.0),  # a request that asks for none
             (chat("Is there a circle?", image(3)), 22, 1.3)]
    handles = []
    for i, (messages, n, penalty) in enumerate(asked):
        handles.append(engine.add_request(messages, SamplingParams(max_new_tokens=n, repetition_penalty=penalty)))
        for _ in range(i + 1):
            engine.step()
    run_until_done(engine)
    assert engine.stats()["mean_batch_occupancy"] > 1.5, "requests were not batched together"
    differs = 0
    for (messages, n, penalty), handle in zip(asked, handles):
        expected = reference_tokens(penalised, messages, n, **({} if penalty is None else
                                                                  {"repetition_penalty": penalty}))
        assert handle.result(timeout=0).token_ids == expected
        differs += expected != reference_tokens(penalised, messages, n, repetition_penalty=1.0)
    assert differs >= 2, "the penalty changed no answer: this test would not see it missing"


def test_a_follow_up_weighs_the_whole_conversation(family, penalised, make_engine):
    """The follow-up's prompt starts from the session cache; its penalty still counts every earlier token."""
    engine = make_engine(family)
    first = chat("Describe the image in detail, please.", image(4))
    h1 = engine.add_request(first, greedy(16), session_id="conversation")
    run_until_done(engine)
    answer = engine.runner.processor.tokenizer.decode(h1.result(timeout=0).token_ids, skip_special_tokens=True)
    follow_up = first + [{"role": "assistant", "content": [{"type": "text", "text": answer}]},
                         {"role": "user", "content": [{"type": "text", "text": "And what else is there?"}]}]
    h2 = engine.add_request(follow_up, greedy(16), session_id="conversation")
    run_until_done(engine)
    assert h2.result(timeout=0).stats.cached_tokens > 0, "the follow-up reused the session cache"
    assert h2.result(timeout=0).token_ids == reference_tokens(penalised, follow_up, 16)


def checkpoint_with(tmp_path, family: str, **generation) -> str:
    folder = tmp_path / family
    shutil.copytree(ensure_tiny_checkpoint(family), folder)
    path = folder / "generation_config.json"
    config = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps({**config, **generation}))
    return str(folder)


def test_a_rule_owlet_does_not_apply_is_refused_at_load_naming_it(tmp_path, caplog):
    folder = checkpoint_with(tmp_path, "llava", repetition_penalty=1.05)
    assert ModelRunner(EngineConfig(model=folder, dtype="float32")).repetition_penalty == 1.05
    neutral = checkpoint_with(tmp_path / "neutral", "llava", no_repeat_ngram_size=0, suppress_tokens=[],
                              bad_words_ids=[], min_length=0)  # as some checkpoints write their rules off
    assert ModelRunner(EngineConfig(model=neutral, dtype="float32")).repetition_penalty == 1.0
    folder = checkpoint_with(tmp_path / "ngram", "llava", no_repeat_ngram_size=3)
    with pytest.raises(ValueError, match=r"no_repeat_ngram_size=3.*OWLET_ALLOW_UNVERIFIED"):
        ModelRunner(EngineConfig(model=folder, dtype="float32"))
    ModelRunner(EngineConfig(model=folder, dtype="float32", allow_unverified=True))
    assert any("no_repeat_ngram_size=3" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("penalty", [0, -1.0, float("nan"), float("inf"), 11.0, True, "1.1"])
def test_a_repetition_penalty_out_of_range_is_refused(penalty):
    with pytest.raises(ValueError, match="repetition_penalty"):
        SamplingParams(repetition_penalty=penalty)
