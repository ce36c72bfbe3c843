"""Sampling parameters: validation, seeded reproducibility inside a batch, and the greedy limits."""
import pytest

from engine import SamplingParams, greedy

from .helpers import chat, image, run_until_done


@pytest.mark.parametrize("kwargs", [dict(max_new_tokens=0), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5),
                                    dict(top_k=-2), dict(seed="x"), dict(stop=[""]), dict(max_new_tokens=2.5),
                                    dict(seed=2**64), dict(seed=-2**63 - 1), dict(temperature=float("nan"))])
def test_invalid_values_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        SamplingParams(**kwargs)


def test_every_seed_in_range_seeds_a_generator_and_the_range_is_what_torch_takes():
    """A seed past the range was admitted, then failed in the engine with torch's "Overflow when unpacking long
    long"; the range is exactly what a generator takes, so no admitted seed fails there."""
    import torch

    from engine.sampler import make_generator
    from engine.sampling_params import SEED_MAX, SEED_MIN
    for seed in (SEED_MIN, -1, 0, 2**63, SEED_MAX):
        assert make_generator(SamplingParams(temperature=0.5, seed=seed), 0) is not None
    for seed in (SEED_MIN - 1, SEED_MAX + 1):
        with pytest.raises((ValueError, RuntimeError, OverflowError)):
            torch.Generator().manual_seed(seed)
        with pytest.raises(ValueError, match=f"seed must be an integer from {SEED_MIN} to {SEED_MAX}"):
            SamplingParams(temperature=0.5, seed=seed)


def test_unknown_keys_from_payload_are_rejected():
    with pytest.raises(ValueError, match="unknown"):
        SamplingParams.from_dict({"temperature": 0.5, "beams": 4})


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(make_engine):
    params = SamplingParams(max_new_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=1234)
    messages = chat("Tell me something.", image(5))
    eng = make_engine("lfm2vl")
    alone = eng.add_request(messages, params)
    run_until_done(eng)
    eng2 = make_engine("lfm2vl")
    others = [eng2.add_request(chat(f"noise {i}"), SamplingParams(max_new_tokens=12, temperature=1.0, seed=i))
              for i in range(3)]
    crowded = eng2.add_request(messages, params)
    run_until_done(eng2)
    assert alone.result(0).token_ids == crowded.result(0).token_ids
    assert len({tuple(o.result(0).token_ids) for o in others}) > 1  # different seeds really sample differently


def test_top_k_1_and_tiny_top_p_equal_greedy(make_engine):
    messages = chat("Describe it.", image(6))
    eng = make_engine("llava")
    hs = [eng.add_request(messages, p) for p in (greedy(10), SamplingParams(max_new_tokens=10, temperature=1.0, top_k=1),
                                                 SamplingParams(max_new_tokens=10, temperature=0.7, top_p=1e-6, seed=3))]
    run_until_done(eng)
    assert hs[0].result(0).token_ids == hs[1].result(0).token_ids == hs[2].result(0).token_ids
