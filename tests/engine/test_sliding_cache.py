"""Sliding-window cache layers (Gemma 3 here: window 16, prompts longer than that) under every cache operation.

End-to-end exactness of batching, chunking and sessions is in test_families.py; these tests pin the invariants
behind it: a cropped window is never sliced to a prefix it no longer holds, a session entry only offers lengths
it can restore exactly, and a failed step rolls sliding layers back.
"""
import pytest
import torch
from transformers.cache_utils import DynamicSlidingWindowLayer

from engine import greedy
from engine.kv import kv_cache
from engine.request import Request

from .helpers import chat, image, run_until_done

FAMILY = "gemma3"


def _prefilled(engine, runner, messages):
    req = Request(request_id="r", prompt=engine.prompts.build(messages), params=greedy(1), handle=None,
                  detokenizer=None)
    while req.remaining_prefill:
        runner.prefill(req, req.remaining_prefill)
    return req


def test_cropped_snapshot_restores_only_at_its_full_length(make_engine, runners):
    engine, runner = make_engine(FAMILY), runners(FAMILY)
    req = _prefilled(engine, runner, chat("Describe the image in detail, please.", image(5, (48, 48))))
    window = runner.text_config.sliding_window
    assert req.prompt_len > window
    snap = kv_cache.snapshot_row(req.cache, 0, req.prompt_len)
    assert snap.cropped and snap.sliding
    for i in snap.sliding:
        assert snap.kv[i][0].shape[-2] == window - 1
    restored = kv_cache.cache_from_snapshot(snap, runner.text_config)
    for i, layer in enumerate(restored.layers):
        if isinstance(layer, DynamicSlidingWindowLayer):
            assert layer.cumulative_length == req.prompt_len
            torch.testing.assert_close(layer.keys, req.cache.layers[i].keys)
        else:
            assert layer.keys.shape[-2] == req.prompt_len
    with pytest.raises(AssertionError, match="no longer holds"):
        kv_cache.cache_from_snapshot(snap, runner.text_config, upto=req.prompt_len - 3)
    assert set(kv_cache.exact_states(snap)) == set(snap.sliding)  # no conv layers in Gemma 3


def test_session_entry_offers_only_checkpointed_lengths(make_engine):
    engine = make_engine(FAMILY)
    messages = chat("What colour is the circle?", image(6, (48, 48)))
    h = engine.add_request(messages, greedy(6), session_id="s")
    run_until_done(engine)
    result = h.result(0)
    entry = engine.sessions.entries.get("s")
    length = result.stats.prompt_tokens + len(result.token_ids) - 1
    assert entry.hybrid and len(entry.token_ids) == length
    assert set(entry.conv_checkpoints) == {result.stats.prompt_tokens, length}
    assert not set(entry.kv) & {i for i, t in enumerate(engine.runner.text_config.layer_types)
                                if t == "sliding_attention"}, "cropped windows live only in the checkpoints"
    diverged = entry.token_ids[:length - 2] + [entry.token_ids[length - 2] + 1] + [1, 2, 3]
    assert entry.usable_prefix(diverged) == result.stats.prompt_tokens
    assert entry.usable_prefix(entry.token_ids + [7, 8]) == length
    assert entry.usable_prefix(entry.token_ids[:5] + [9] * 40) == 0


def test_rollback_restores_sliding_layers(make_engine):
    engine = make_engine(FAMILY, max_running=4)
    for i in range(2):
        engine.add_request(chat("Describe the image in detail." * (i + 1), image(7 + i, (48, 48))), greedy(20))
        engine.step()
    engine.step()
    assert len(engine.batch) == 2
    cache = engine.batch.cache
    before = [(layer.keys.clone(), getattr(layer, "cumulative_length", None)) for layer in cache.layers]
    undo = kv_cache.undo_point(cache)
    engine.runner.decode(engine.batch)  # appends one position to every layer, as a half-failed step may
    kv_cache.rollback(cache, undo)
    for (keys, cum), layer in zip(before, cache.layers):
        torch.testing.assert_close(layer.keys, keys)
        assert getattr(layer, "cumulative_length", None) == cum
