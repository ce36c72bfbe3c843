"""KV-cache quantization for session parking: error bounds, exact restore, byte accounting, targets.

Shapes follow real caches: [B=1, kv_heads, T, head_dim] with LFM2-VL-1.6B's 8 heads x 64 and the
small head dims of the tiny test models. The byte targets are against 16-bit model dtypes
(fp16 on GPU, bf16 on CPU): int8 <= 53 %, int4 <= 30 %.
"""
from __future__ import annotations

import pytest
import torch

from engine.kv.kv_quant import DEFAULT_GROUP_SIZE, FullPrecisionTensor, QuantizedTensor, park_kv, quantize_kv

MODES = ("int8", "int4")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Relative rounding of the restored values when cast back to the original dtype (half an ulp).
OUTPUT_ROUNDING = {torch.float32: 2.0**-23, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}
TARGET = {"int8": 0.53, "int4": 0.30}


def kv(shape, dtype=torch.float32, seed=0):
    """Cache-like values: mostly unit scale, with a few outlier channels as real K tensors have."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(shape, generator=g)
    t[..., :2] *= 8.0
    return t.to(dtype)


def held_tensors(q):
    if isinstance(q, FullPrecisionTensor):
        return [q.data]
    return [x for x in (q.data, q.scale, q.minimum) if x is not None]


def per_group(t: torch.Tensor, group_size: int, per_channel: bool = False) -> torch.Tensor:
    """A [B, H, T, D] tensor's values as [groups, group_size] in the documented grouping: per head
    along the row-major [T, D] block, or per channel along T. Each head's (channel's) short last
    group is padded with its last value, which changes no group statistic."""
    rows = t.transpose(-1, -2) if per_channel else t
    rows = rows.reshape(-1, rows.shape[-2] * rows.shape[-1]) if not per_channel else rows.reshape(-1, t.shape[-2])
    rows = rows.float()
    pad = -rows.shape[1] % group_size
    return torch.cat((rows, rows[:, -1:].expand(rows.shape[0], pad)), dim=1).reshape(-1, group_size)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("head_dim", (16, 32, 64))
@pytest.mark.parametrize("per_channel", (False, True))
def test_round_trip_error_is_within_half_a_step_of_each_groups_range(mode, dtype, head_dim, per_channel):
    t = kv((1, 8, 77, head_dim), dtype)
    q = quantize_kv(t, mode, per_channel=per_channel)
    assert q.scale.numel() == per_group(t, DEFAULT_GROUP_SIZE, per_channel).shape[0]
    assert_within_half_a_step(t, q.dequantize(), mode, per_channel)


def assert_within_half_a_step(t, restored, mode, per_channel=False):
    """Every restored value lies within half a quantization step of the original (the step being its group's)."""
    dtype = t.dtype
    groups = per_group(t, DEFAULT_GROUP_SIZE, per_channel)
    err = per_group((restored.float() - t.float()).abs(), DEFAULT_GROUP_SIZE, per_channel).amax(dim=1)
    absmax = groups.abs().amax(dim=1)
    if mode == "int8":
        half_step = absmax / 127 / 2
    else:
        half_step = (groups.amax(dim=1) - groups.amin(dim=1)) / 15 / 2
    # Scales are rounded up when narrowed to 16 bits (<= 1 % wider steps); the restored values
    # are then rounded once more to the original dtype.
    bound = half_step * 1.01 + absmax * OUTPUT_ROUNDING[dtype] + 1e-12
    assert (err <= bound).all(), f"worst excess {float((err - bound).max()):.3g}"
    # The bound is tight enough to matter: int4 keeps absmax/15, int8 absmax/254 of every group.
    limit = (1 / 15 if mode == "int4" else 1 / 254) + 2 * OUTPUT_ROUNDING[dtype]
    assert (err <= absmax * limit * 1.02).all()


@pytest.mark.parametrize("mode", MODES)
def test_values_on_the_grid_restore_exactly(mode):
    # int4: a 0..15 ramp per group is exactly its own grid (min 0, step 1).
    # int8: k * 0.5 with |k| <= 127 and k = 127 in every group is exactly the grid of step 0.5.
    if mode == "int4":
        t = torch.arange(16.0).repeat(8).reshape(1, 2, 4, 16)
    else:
        k = torch.randint(-127, 128, (4, 64), generator=torch.Generator().manual_seed(1)).float()
        k[:, 0] = 127
        t = (k * 0.5).reshape(1, 4, 4, 16)
    q = quantize_kv(t, mode, group_size=16 if mode == "int4" else 64)
    assert torch.equal(q.dequantize(), t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("per_channel", (False, True))
@pytest.mark.parametrize("shape", [(1, 8, 1, 64), (1, 8, 129, 64), (1, 2, 3, 16), (1, 3, 5, 7),
                                   (2, 4, 9, 32), (1, 8, 0, 64), (3, 5)])
def test_restores_exact_shape_and_dtype(shape, mode, dtype, per_channel):
    t = kv(shape, dtype)
    restored = quantize_kv(t, mode, per_channel=per_channel).dequantize()
    assert restored.shape == t.shape and restored.dtype == dtype and restored.device == t.device
    assert restored.is_contiguous()


@pytest.mark.parametrize("mode", ("none",) + MODES)
@pytest.mark.parametrize("per_channel", (False, True))
@pytest.mark.parametrize("shape", [(1, 8, 100, 64), (1, 3, 5, 7), (1, 2, 1, 16), (1, 8, 0, 64)])
def test_nbytes_equals_the_storage_actually_held(mode, shape, per_channel):
    t = kv(shape, torch.bfloat16)
    parked = park_kv(t, mode, per_channel=per_channel)
    held = held_tensors(parked)
    assert parked.nbytes == sum(x.nbytes for x in held)
    # No view keeps a larger (padded) buffer alive behind the accounted bytes.
    assert parked.nbytes == sum(x.untyped_storage().nbytes() for x in held)


@pytest.mark.parametrize("model_dtype", (torch.float16, torch.bfloat16))
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kv_heads,head_dim", [(8, 64), (8, 32), (4, 32), (2, 16), (8, 16)])
@pytest.mark.parametrize("tokens", (1, 16, 33, 1000))
def test_bytes_meet_the_targets_against_the_16_bit_model_dtype(mode, model_dtype, kv_heads, head_dim, tokens):
    t = kv((1, kv_heads, tokens, head_dim), model_dtype)
    q = quantize_kv(t, mode)
    # Codes take 1 (int8) or 1/2 (int4) byte a value; each group adds one (int8) or two (int4)
    # 2-byte numbers, and each head's last group may be short.
    groups = kv_heads * -(-tokens * head_dim // DEFAULT_GROUP_SIZE)
    code_bytes = t.numel() if mode == "int8" else -(-t.numel() // 2)
    assert q.nbytes == code_bytes + groups * 2 * (1 if mode == "int8" else 2)
    ratio = q.nbytes / t.nbytes
    if tokens * head_dim >= 256:  # the byte targets hold from 256 values per head on
        assert ratio <= TARGET[mode], f"{mode} holds {ratio:.3f} of {model_dtype} bytes"
    else:  # a few tokens of a tiny model: a short group's scale weighs more, still a saving
        assert ratio < 0.57 if mode == "int8" else ratio < 0.38


@pytest.mark.parametrize("mode", MODES)
def test_per_channel_bytes_meet_the_targets_for_long_sessions(mode):
    t = kv((1, 8, 200, 64), torch.float16)  # 200 tokens: 4 groups per channel, the last short
    q = quantize_kv(t, mode, per_channel=True)
    assert q.scale.numel() == 8 * 64 * 4
    assert q.nbytes / t.nbytes <= TARGET[mode]


@pytest.mark.parametrize("mode", MODES)
def test_all_zero_and_constant_groups_restore_exactly(mode):
    t = torch.zeros(1, 2, 4, 32, dtype=torch.bfloat16)
    t[0, 1] = -3.25  # a constant group that is not zero
    q = quantize_kv(t, mode)
    assert torch.equal(q.dequantize(), t)
    assert torch.isfinite(q.scale.float()).all()


def test_fp16_scales_for_fp16_tensors_and_bf16_otherwise():
    assert quantize_kv(kv((1, 2, 4, 32), torch.float16), "int8").scale.dtype == torch.float16
    for dtype in (torch.bfloat16, torch.float32):
        q = quantize_kv(kv((1, 2, 4, 32), dtype), "int4")
        assert q.scale.dtype == torch.bfloat16 and q.minimum.dtype == torch.bfloat16


def test_large_and_tiny_magnitudes_stay_in_range():
    # fp32 values beyond fp16's range and far below it: scales must neither overflow nor vanish.
    t = torch.tensor([[1e30, -2e30, 3.0, 0.0], [1e-30, -2e-30, 4e-30, 0.0]]).repeat(1, 8).reshape(2, 1, 32)
    for mode in MODES:
        restored = quantize_kv(t, mode, group_size=32).dequantize()
        assert torch.isfinite(restored).all()
        for row in range(2):
            absmax = t[row].abs().max()
            assert (restored[row] - t[row]).abs().max() <= absmax / 15 * 1.02


def test_non_contiguous_input_is_quantized_in_logical_order():
    base = kv((1, 64, 8, 8))
    t = base.transpose(1, 2)  # [1, 8, 64, 8], not contiguous
    assert not t.is_contiguous()
    assert torch.equal(quantize_kv(t, "int8").dequantize(), quantize_kv(t.contiguous(), "int8").dequantize())


@pytest.mark.parametrize("bad_call,message", [
    (lambda: quantize_kv(torch.ones(4), "fp8"), "mode"),
    (lambda: quantize_kv(torch.ones(4), "int4", group_size=7), "even"),
    (lambda: quantize_kv(torch.ones(4), "int8", group_size=0), "group_size"),
    (lambda: quantize_kv(torch.ones(4, dtype=torch.int32), "int8"), "floating-point"),
    (lambda: quantize_kv(torch.tensor([1.0, float("nan")]), "int8"), "inf or nan"),
    (lambda: quantize_kv(torch.tensor([1.0, float("inf")]), "int4"), "inf or nan"),
    (lambda: quantize_kv(torch.ones(4), "int8", per_channel=True), "per_channel"),
])
def test_bad_input_gets_a_clear_error(bad_call, message):
    with pytest.raises(ValueError, match=message):
        bad_call()


def test_odd_group_sizes_work_for_int8():
    t = kv((1, 3, 5, 7))
    q = quantize_kv(t, "int8", group_size=7)  # one group per (head, token)
    assert q.scale.numel() == 15
    assert (q.scale.float().reshape(15) >= t.abs().reshape(15, 7).amax(dim=1) / 127).all()
    assert (q.dequantize() - t).abs().max() <= t.abs().max() / 254 * 1.02


def test_parked_copies_are_independent_of_the_live_cache():
    t = kv((1, 2, 8, 32))
    parked = {mode: park_kv(t, mode) for mode in ("none",) + MODES}
    before = {mode: p.dequantize().clone() for mode, p in parked.items()}
    t.fill_(123.0)  # the live cache is reused for other rows after parking
    for mode, p in parked.items():
        assert torch.equal(p.dequantize(), before[mode]), mode
        p.dequantize().fill_(-1.0)  # a restored cache updated in place leaves the parked copy alone
        assert torch.equal(p.dequantize(), before[mode]), mode
    assert isinstance(parked["none"], FullPrecisionTensor) and isinstance(parked["int8"], QuantizedTensor)


@pytest.mark.parametrize("mode", ("none",) + MODES)
def test_restore_into_another_dtype_matches_restore_then_cast(mode):
    t = kv((1, 4, 20, 32), torch.bfloat16)
    parked = park_kv(t, mode)
    assert parked.device.type == "cpu"
    as_fp32 = parked.dequantize(dtype=torch.float32)
    assert as_fp32.dtype == torch.float32
    assert torch.equal(as_fp32.to(torch.bfloat16), parked.dequantize())
    if mode == "none":
        assert torch.equal(parked.dequantize(), t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("mode", MODES)
def test_quantize_on_device_park_on_host_restore_on_device(mode):
    t = kv((1, 8, 300, 64), torch.float16).cuda()
    parked = park_kv(t, mode)  # quantized on the GPU, stored on the host
    assert parked.device.type == "cpu" and parked.nbytes / t.nbytes <= TARGET[mode]
    restored = parked.dequantize(device="cuda")
    assert restored.device.type == "cuda" and restored.dtype == torch.float16
    # The device's result need not equal the host's bit for bit: CUDA divides by a scalar through its reciprocal,
    # so a group's step can land one fp16 ulp apart and shift codes by one (on an H200, 5 % of int4 values).
    # What must hold on either is the contract: every value within half a step of the original.
    assert_within_half_a_step(t.cpu(), restored.cpu(), mode)


@pytest.mark.parametrize("mode,max_rel_err", [("int8", 0.04), ("int4", 0.35)])
def test_attention_over_restored_kv_stays_close(mode, max_rel_err):
    """What parking must preserve: attention outputs over the restored K/V, far closer to the
    original than attention over shuffled keys (a cache that lost its information). Keys carry
    outlier channels, as real ones do, which per-channel key scales absorb better."""
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(1, 8, 200, 64, generator=g)
    keys[..., :2] *= 4
    values = torch.randn(1, 8, 200, 64, generator=g)
    query = torch.randn(1, 8, 4, 64, generator=g) * 2
    attend = torch.nn.functional.scaled_dot_product_attention
    ref = attend(query, keys, values)
    rel = lambda out: float((out - ref).norm() / ref.norm())  # noqa: E731
    lost = rel(attend(query, keys[:, :, torch.randperm(200, generator=g)], values))
    restored_values = quantize_kv(values, mode).dequantize()
    per_token = rel(attend(query, quantize_kv(keys, mode).dequantize(), restored_values))
    per_channel = rel(attend(query, quantize_kv(keys, mode, per_channel=True).dequantize(), restored_values))
    assert 0 < per_channel < per_token <= max_rel_err, (per_channel, per_token)
    assert per_token < lost / 4, (per_token, lost)
