"""LFM2's short-conv decode step (engine/short_conv.py): the same outputs and states as transformers' own layer,
only on a one-token CPU step under inference, and never inside a reference run."""
import copy

import pytest
import torch
from transformers import DynamicCache, Lfm2Config, Lfm2Model

from engine import cpu_linear, short_conv


def _tiny_lfm2(seed=0):
    torch.manual_seed(seed)
    config = Lfm2Config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention", "conv",
                                                                                    "conv"], conv_L_cache=3)
    return Lfm2Model(config).eval()


def _convs(model):
    return [m for m in model.modules() if type(m).__name__ == "Lfm2ShortConv"]


def _decode_steps(model, ids, new_ids):
    """Prefill ``ids`` (one row each), then one decode step per column of ``new_ids``: the last hidden states of
    every step and the cache's conv states at the end."""
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids, cache=cache, use_cache=True)
        outs = [model(input_ids=new_ids[:, i:i + 1], cache=cache, use_cache=True).last_hidden_state
                for i in range(new_ids.shape[1])]
    states = [cache.layers[i].conv_states[0].clone() for i, t in enumerate(model.config.layer_types) if t == "conv"]
    return torch.cat(outs, dim=1), states


@pytest.mark.parametrize("bias", [False, True])
def test_fast_decode_matches_the_layers_own_step(bias, monkeypatch):
    own = _tiny_lfm2()
    for conv in _convs(own):
        if bias:
            conv.conv.bias = torch.nn.Parameter(torch.randn(conv.conv.out_channels))
    fast = copy.deepcopy(own)
    assert short_conv.install(fast) == 3 and short_conv.install(fast) == 0, "installed once per layer"
    taken = []
    real = short_conv._decode_state
    monkeypatch.setattr(short_conv, "_decode_state", lambda *a: taken.append(real(*a) is not None) or real(*a))
    ids, new = torch.randint(0, 64, (3, 7)), torch.randint(0, 64, (3, 5))
    want_out, want_states = _decode_steps(own, ids, new)
    got_out, got_states = _decode_steps(fast, ids, new)
    torch.testing.assert_close(got_out, want_out, rtol=1e-5, atol=1e-5)
    for got, want in zip(got_states, want_states):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    # 3 layers x (one 7-token prefill that is the layer's own + five decode steps that are the engine's)
    assert taken == [False] * 3 + [True] * 15


def test_reference_runs_and_training_take_the_layers_own_code():
    model = _tiny_lfm2()
    short_conv.install(model)
    ids = torch.randint(0, 64, (2, 4))
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=ids, cache=cache, use_cache=True)
    with torch.inference_mode(), cpu_linear.unpacked():
        assert cpu_linear.reference_mode()
        state = short_conv._decode_state(_convs(model)[0], torch.zeros(2, 1, 64), cache)
    assert state is None
    assert not cpu_linear.reference_mode()
    cache2 = DynamicCache(config=model.config)
    model(input_ids=ids, cache=cache2, use_cache=True)  # grad mode (training): the layer's own path
    assert short_conv._decode_state(_convs(model)[0], torch.zeros(2, 1, 64), cache2) is None
    with torch.inference_mode():
        assert short_conv._decode_state(_convs(model)[0], torch.zeros(2, 1, 64), cache) is not None
        assert short_conv._decode_state(_convs(model)[0], torch.zeros(3, 1, 64), cache) is None, "rows differ"
        assert short_conv._decode_state(_convs(model)[0], torch.zeros(2, 2, 64), cache) is None, "two tokens"
        assert short_conv._decode_state(_convs(model)[0], torch.zeros(2, 1, 64), None) is None


def test_the_engines_runner_installs_it_on_cpu(runners):
    runner = runners("lfm2vl")
    convs = [m for m in runner.model.modules() if short_conv._is_short_conv(m)]
    assert convs and runner.fast_conv_layers == len(convs)
    assert all(getattr(m.forward, "owlet_fast_decode", False) for m in convs)
    assert runners("llava").fast_conv_layers == 0
