"""Batched prefill (engine/batch/prefill_batch.py) must not change what the model says: a burst of new prompts of mixed
lengths, with and without images, prefilled in few left-padded forwards gives fp32 greedy tokens equal to
per-request generate(), on the slot and the dynamic decode paths, and on every family the tests build."""
import pytest
import torch

from engine import greedy
from engine.batch.prefill_batch import MAX_PADDING_SHARE, groups
from engine.prompt import Prompt
from engine.request import Request
from engine.models.reference_run import reference_run

from .helpers import chat, image, reference_tokens, run_until_done

QUESTIONS = ["What colour is it?", "Describe the image in detail, please.", "Is there a circle?",
             "How many shapes are there, and where is the largest one?", "hi", "Tell me a story about owls. " * 3,
             "Where is the star?"]


def burst():
    """7 requests at once: images of different sizes (so different image token counts), two text-only."""
    return [(chat(q, None if i in (2, 5) else image(60 + i, (40 + 12 * i, 64 - 4 * (i % 3)))), 4 + 2 * i)
            for i, q in enumerate(QUESTIONS)]


def serve_burst(engine, reqs):
    handles = [engine.add_request(m, greedy(n)) for m, n in reqs]
    run_until_done(engine)
    return [h.result(0) for h in handles]


def test_groups_bound_the_padding_share():
    lengths = [100, 98, 95, 30, 29, 12, 100, 60]
    out = groups(lengths)
    assert sorted(i for g in out for i in g) == list(range(len(lengths)))
    for g in out:
        longest = max(lengths[i] for i in g)
        assert 1 - sum(lengths[i] for i in g) / (longest * len(g)) <= MAX_PADDING_SHARE
    assert {0, 1, 2, 6} <= set(out[0]) and len(out) >= 2, "similar lengths share one forward"
    assert groups([50] * 64) == [list(range(64))]
    assert len(groups([400, 20])) == 2, "a short prompt does not pay for a long one's padding"


@pytest.mark.parametrize("cache", ["slots", "dynamic"])
def test_burst_matches_generate(family, cache, make_engine, runners):
    engine = make_engine(family, max_running=8, max_prefill_tokens=4096, decode_cache=cache, batched_prefill="on")
    reqs = burst()
    vision_before = engine.runner.vision_forwards
    results = serve_burst(engine, reqs)
    stats = engine.stats()
    images = sum(1 for m, _ in reqs if len(m[0]["content"]) == 2)
    assert engine.runner.vision_forwards - vision_before < images, "the burst's images were encoded together"
    assert sum(r.stats.image_cache_hits for r in results) == 0, "an image encoded for the burst is no cache hit"
    assert stats["prefill_batched_rows"] >= 5, "the burst was not prefilled together"
    assert stats["prefill_forwards"] < len(reqs) + 1, "fewer forwards than prompts (a cold head costs one step)"
    assert stats["prefill_batch_fallbacks"] == 0
    for (messages, n), result in zip(reqs, results):
        assert result.token_ids == reference_tokens(runners(family), messages, n)


def test_fewer_forwards_than_one_at_a_time_with_a_warm_head(family, make_engine, runners):
    """With the template head cached (any engine after its first turn) a burst is one forward per length group;
    each row recomputes the head in the batch instead of restoring it, and says so in its stats."""
    counts = {}
    for on in (True, False):
        # Shared prefixes off: alone, a hybrid model's cold prompt also pauses at its share points (one forward each,
        # engine/kv/prefix_index.py); this counts what batching saves.
        engine = make_engine(family, max_running=8, max_prefill_tokens=4096, batched_prefill="on" if on else "off",
                             shared_prefixes=False)
        serve_burst(engine, [(chat("warm up"), 2)])
        before = engine.stats()["prefill_forwards"]
        reqs = burst()
        results = serve_burst(engine, reqs)
        counts[on] = engine.stats()["prefill_forwards"] - before
        for (messages, n), result in zip(reqs, results):
            assert result.token_ids == reference_tokens(runners(family), messages, n)
        assert all(r.stats.cached_tokens == 0 for r in results) == on
    assert counts[False] == len(burst())
    assert counts[True] <= 3


def test_chunked_burst_matches_generate(family, make_engine, runners):
    """A budget smaller than the burst: first chunks are prefilled together, later chunks alone."""
    engine = make_engine(family, max_running=8, max_prefill_tokens=96, batched_prefill="on")
    reqs = burst()
    results = serve_burst(engine, reqs)
    assert engine.stats()["prefill_batched_rows"] >= 2
    for (messages, n), result in zip(reqs, results):
        assert result.token_ids == reference_tokens(runners(family), messages, n)


def test_follow_up_prefills_alone_next_to_a_batched_burst(family, make_engine, runners, monkeypatch):
    """The first turn is prefilled in a batch; its session entry (K/V and, on LFM2, the conv checkpoint at the
    prompt's end) then serves the follow-up exactly."""
    engine = make_engine(family, max_running=8, max_prefill_tokens=4096, batched_prefill="on")
    real, completed_in_batch = engine.runner.prefill_together, set()

    def spy(reqs, n_tokens):  # the requests whose prompt a batched forward finishes
        completed_in_batch.update(r.request_id for r, n in zip(reqs, n_tokens) if r.num_computed + n == r.prompt_len)
        return real(reqs, n_tokens)
    monkeypatch.setattr(engine.runner, "prefill_together", spy)
    first = chat("What colour is the circle?", image(71, (64, 48)))
    h = engine.add_request(first, greedy(5), session_id="s")
    others = [engine.add_request(m, greedy(n)) for m, n in burst()[4:]]
    run_until_done(engine)
    answer = h.result(0)
    assert answer.token_ids == reference_tokens(runners(family), first, 5)
    assert all(o.result(0).error is None for o in others)
    assert h.request_id in completed_in_batch, "the first turn was prefilled in a batch"
    follow = first + [{"role": "assistant", "content": [{"type": "text", "text": answer.text}]},
                      {"role": "user", "content": [{"type": "text", "text": "And the background?"}]}]
    handles = [engine.add_request(follow, greedy(6), session_id="s")]
    reqs = burst()[:4]
    handles += [engine.add_request(m, greedy(n)) for m, n in reqs]
    run_until_done(engine)
    got = handles[0].result(0)
    assert got.stats.cache_source == "session" and got.stats.cached_tokens >= answer.stats.prompt_tokens
    assert got.token_ids == reference_tokens(runners(family), follow, 6)
    for (messages, n), h in zip(reqs, handles[1:]):
        assert h.result(0).token_ids == reference_tokens(runners(family), messages, n)
    assert handles[0].request_id not in completed_in_batch, "a follow-up prefills alone"
    assert all(h.request_id in completed_in_batch for h in handles[1:])


def test_a_failed_batched_forward_falls_back_to_one_at_a_time(make_engine, runners, monkeypatch):
    engine = make_engine("lfm2vl", max_running=8, max_prefill_tokens=4096, batched_prefill="on")

    def broken(requests, n_tokens):
        raise RuntimeError("injected")
    monkeypatch.setattr(engine.runner, "prefill_together", broken)
    reqs = burst()[:4]
    results = serve_burst(engine, reqs)
    assert engine.stats()["prefill_batch_fallbacks"] >= 1 and engine.stats()["prefill_batched_rows"] == 0
    for (messages, n), result in zip(reqs, results):
        assert result.token_ids == reference_tokens(runners("lfm2vl"), messages, n)


def test_conv_layers_with_a_bias_prefill_one_at_a_time(runners, monkeypatch):
    """A padded position gives a conv input of bias*bias, not zero: left padding would not be exact there."""
    runner = runners("lfm2vl")
    req = Request(request_id="r", prompt=Prompt(token_ids=[1, 2, 3]), params=greedy(1), handle=None,
                  detokenizer=None)
    assert runner.can_prefill_together(req)
    monkeypatch.setattr(runner.text_config, "conv_bias", True)
    assert not runner.can_prefill_together(req)


@pytest.mark.parametrize("fam", ["lfm2vl", "llava", "qwen2vl", "qwen2_5vl", "mistral3", "idefics3", "smolvlm",
                                 "internvl"])
def test_batched_logits_match_the_models_own_forward(fam, make_engine, runners):
    """Stricter than greedy tokens: each row's last prompt logits from one left-padded forward equal the
    reference forward's on that prompt alone, to 1e-4."""
    engine = make_engine(fam)
    runner = runners(fam)
    chats = [chat("Is the circle red or blue?", image(81, (56, 48))), chat("hi"),
             [{"role": "user", "content": [{"type": "text", "text": "What is it? " * 4},
                                          {"type": "image", "image": image(82, (40, 64))}]}]]
    reqs = [Request(request_id=str(i), prompt=engine.prompts.build(m), params=greedy(1), handle=None,
                    detokenizer=None) for i, m in enumerate(chats)]
    assert len({r.prompt_len for r in reqs}) == 3
    assert all(runner.can_prefill_together(r) for r in reqs)
    logits = runner.prefill_together(reqs, [r.prompt_len for r in reqs])
    for messages, req, got in zip(chats, reqs, logits):
        assert req.remaining_prefill == 0 and req.cache.get_seq_length() == req.prompt_len
        inputs = runner.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True, return_tensors="pt")
        with torch.inference_mode(), reference_run():
            want = runner.model(**inputs).logits[0, -1]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("fam", ["qwen2vl", "mistral3", "idefics3", "smolvlm", "internvl", "qwen3vl", "gemma3"])
def test_burst_matches_generate_on_other_families(fam, make_engine, runners):
    """Families whose row says ``prefill_together=False`` fall back to one at a time: exact either way."""
    from tests.engine.test_families import reference

    engine = make_engine(fam, max_running=6, max_prefill_tokens=4096, batched_prefill="on")
    reqs = burst()[:5]
    results = serve_burst(engine, reqs)
    batched = engine.stats()["prefill_batched_rows"]
    assert (batched >= 4) == engine.runner.family.prefill_together
    for (messages, n), result in zip(reqs, results):
        assert result.token_ids == reference(runners(fam), messages, n)


def test_auto_batches_on_cuda_only(make_engine):
    """auto: a batched forward of a burst measured slower than one by one on CPU (docs/benchmarks.md)."""
    assert not make_engine("lfm2vl")._batched_prefill  # the tests' runner is on CPU
    assert make_engine("lfm2vl", batched_prefill="on")._batched_prefill
    with pytest.raises(ValueError, match="batched_prefill"):
        make_engine("lfm2vl", batched_prefill="yes")
