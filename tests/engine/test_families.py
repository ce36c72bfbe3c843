"""The VLM families people bring, each token-exact against per-request generate() on its processor's own template.

Every family in engine/models/families.py gets the same checks on a tiny fp32 checkpoint with its real processor class:
prompt ids equal ``processor.apply_chat_template(..., tokenize=True)``; 6+ staggered requests with different
images and prompt lengths; the same requests time-sliced over two rows; a session follow-up adding a new image
batched with a fresh request; chunked prefill.
"""
import pytest
import torch

from engine import greedy
from engine.models.reference_run import reference_run

from .helpers import chat, image, run_until_done, serve_staggered

FAMILIES = ["qwen2vl", "qwen2_5vl", "qwen3vl", "gemma3", "mistral3", "idefics3", "smolvlm", "internvl"]
QUESTIONS = ["What colour is it?", "Describe the image in detail, please.", "Is there a circle?",
             "How many shapes are there, and where is the largest one?", "hi", "Where is the star?"]


@pytest.fixture(scope="module", params=FAMILIES)
def fam(request):
    return request.param


def reference_inputs(runner, messages):
    return runner.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=True, return_tensors="pt")


def reference(runner, messages, n: int) -> list[int]:
    inputs = reference_inputs(runner, messages)
    with torch.inference_mode(), reference_run():  # the model's own code, not the engine's CPU kernels
        out = runner.model.generate(**inputs, max_new_tokens=n, do_sample=False)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def workload():
    reqs = []
    for i, q in enumerate(QUESTIONS):
        img = None if i == 2 else image(20 + i, size=(40 + 12 * i, 64 - 4 * i))
        reqs.append((chat(q, img), 5 + 2 * i))
    return reqs


TWO_IMAGE_CHAT = [{"role": "user", "content": [{"type": "image", "image": image(1, (48, 40))},
                                              {"type": "text", "text": "What is it?"}]},
                  {"role": "assistant", "content": [{"type": "text", "text": "A circle."}]},
                  {"role": "user", "content": [{"type": "text", "text": "And this?"},
                                               {"type": "image", "image": image(2, (56, 64))}]}]


def test_prompt_ids_equal_the_processors(fam, make_engine, runners):
    want = reference_inputs(runners(fam), TWO_IMAGE_CHAT)["input_ids"][0].tolist()
    assert make_engine(fam).prompts.build(TWO_IMAGE_CHAT).token_ids == want


@pytest.mark.parametrize("original", ["lfm2vl", "llava"])
def test_prompt_ids_equal_the_processors_for_lfm2vl_and_llava(original, make_engine, runners):
    want = reference_inputs(runners(original), TWO_IMAGE_CHAT)["input_ids"][0].tolist()
    assert make_engine(original).prompts.build(TWO_IMAGE_CHAT).token_ids == want


def test_bos_comes_from_the_tokenizer_when_the_template_writes_none(make_engine, runners):
    """Mistral's tokenizer adds BOS by itself: once at the start, as the processor does, never per image."""
    import copy

    from engine.prompt import PromptBuilder
    from training.tiny_families import MISTRAL_TEMPLATE

    runner = runners("mistral3")
    processor = copy.copy(runner.processor)
    processor.chat_template = MISTRAL_TEMPLATE.replace("{{- bos_token -}}", "")
    builder = PromptBuilder(processor, runner.image_token_id, max_image_pixels=2**20, max_images=8)
    ids = builder.build(TWO_IMAGE_CHAT).token_ids
    want = processor.apply_chat_template(TWO_IMAGE_CHAT, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"][0].tolist()
    bos = processor.tokenizer.bos_token_id
    assert ids == want and ids[0] == bos and ids.count(bos) == 1


def test_staggered_batch_matches_generate(fam, make_engine, runners):
    engine = make_engine(fam, max_running=6)
    reqs = workload()
    handles = serve_staggered(engine, reqs, steps_after=lambda i: i % 2 + 1)
    assert engine.stats()["mean_batch_occupancy"] > 1.5, "requests were not batched together"
    for (messages, n), h in zip(reqs, handles):
        assert h.result(timeout=0).token_ids == reference(runners(fam), messages, n)


def test_time_sliced_answers_match_generate(fam, make_engine, runners):
    """Six groups share two rows, a slice of two tokens each: every answer is paused and resumed, and unchanged."""
    engine = make_engine(fam, max_running=2, time_slice_tokens=2)
    reqs = workload()
    handles = [engine.add_request(m, greedy(n), group=f"addr:{i}") for i, (m, n) in enumerate(reqs)]
    run_until_done(engine)
    results = [h.result(timeout=0) for h in handles]
    assert sum(r.stats.pauses for r in results) >= len(reqs), "the rows were not shared"
    for (messages, n), result in zip(reqs, results):
        assert result.token_ids == reference(runners(fam), messages, n)


def test_session_follow_up_with_new_image_batched_with_fresh_request(fam, make_engine, runners):
    engine = make_engine(fam, max_running=4)
    first = chat("What colour is the circle?", image(31, (64, 48)))
    h = engine.add_request(first, greedy(6), session_id="s")
    run_until_done(engine)
    answer = h.result(0)
    follow = first + [{"role": "assistant", "content": [{"type": "text", "text": answer.text}]},
                      {"role": "user", "content": [{"type": "image", "image": image(32, (48, 64))},
                                                   {"type": "text", "text": "And this one?"}]}]
    fresh = chat("Describe the image in detail, please.", image(33, (56, 56)))
    h_follow = engine.add_request(follow, greedy(8), session_id="s")
    engine.step()
    h_fresh = engine.add_request(fresh, greedy(8))
    run_until_done(engine)
    ref = runners(fam)
    assert answer.token_ids == reference(ref, first, 6)
    got = h_follow.result(0)
    assert got.stats.cache_source == "session" and got.stats.cached_tokens >= answer.stats.prompt_tokens
    assert got.token_ids == reference(ref, follow, 8)
    assert h_fresh.result(0).token_ids == reference(ref, fresh, 8)


def test_chunked_prefill_matches_generate(fam, make_engine, runners):
    engine = make_engine(fam, max_prefill_tokens=16)
    short = (chat("hi"), 8)
    long = (chat("Describe everything you can see. " * 3, image(34, (72, 64))), 8)
    h1 = engine.add_request(short[0], greedy(short[1]))
    engine.step()
    h2 = engine.add_request(long[0], greedy(long[1]))
    run_until_done(engine)
    assert h2.result(0).stats.prompt_tokens > 3 * 16
    assert h1.result(0).token_ids == reference(runners(fam), *short)
    assert h2.result(0).token_ids == reference(runners(fam), *long)


@pytest.mark.parametrize("chunk", [None, 7])
def test_prefill_logits_match_the_models_own_forward(fam, make_engine, runners, chunk):
    """Stricter than greedy tokens: the last prompt logits equal the reference forward's to 1e-4, whole or in
    chunks. Small input differences (a missing bidirectional image mask, DeepStack, M-RoPE) show up here even
    where they do not flip a greedy token."""
    from engine.request import Request

    engine = make_engine(fam)
    runner = runners(fam)
    # The image comes last, so the final logits sit close to it (Gemma 3's sliding layers see it too).
    messages = [{"role": "user", "content": [{"type": "text", "text": "Is the circle red or blue?"},
                                             {"type": "image", "image": image(41, (56, 48))}]}]
    prompt = engine.prompts.build(messages)
    req = Request(request_id="r", prompt=prompt, params=greedy(1), handle=None, detokenizer=None)
    while req.remaining_prefill:
        logits = runner.prefill(req, chunk or req.remaining_prefill)
    with torch.inference_mode(), reference_run():
        want = runner.model(**reference_inputs(runner, messages)).logits[0, -1]
    torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4)
