"""KV-cache quantization for parking idle sessions in host memory.

An idle conversation's attention K/V tensors ([B, kv_heads, T, head_dim], after rope) can be
moved off the device and stored as int8 or 4-bit, then restored on resume. LFM2 conv states are
tiny and numerically sensitive, so they are parked in full precision (mode ``"none"``).

What this module knows: tensors, groups, scales. What it does not know: caches, sessions, or
when to park; the session store decides that and calls :func:`park_kv`.

Layout. Groups never span heads. By default each head's [T, head_dim] block is read in row-major
order and cut into groups of ``group_size`` consecutive values: with ``head_dim == group_size``
every group is one token of one head (per-token scales), and with a smaller head_dim (tiny test
models) a group spans ``group_size // head_dim`` consecutive tokens, so small head dims still meet
the byte targets. With ``per_channel=True`` (KIVI-style, for keys, whose outliers sit in fixed
channels) each channel is grouped along the token axis instead. A head's (or channel's) last group
may be short: codes are stored for the real values only, never for padding.

- ``int8``: symmetric, one scale per group; error <= scale / 2 = absmax / 254 (per group).
- ``int4``: asymmetric (per-group minimum and step, 16 levels), two values per uint8;
  error <= step / 2 = (max - min) / 30 <= absmax / 15 (per group).

Scales are stored in fp16 for fp16 tensors and in bf16 otherwise (bf16 covers fp32's range).
They are rounded *up* (and int4 minimums *down*) when narrowed, so every value stays inside the
quantization grid and nothing is clipped. With the default group of 64 values, int8 holds
0.516 and int4 0.281 of the 16-bit bytes (plus one short group per head or channel).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Union

import torch

KVQuantMode = Literal["none", "int8", "int4"]
DEFAULT_GROUP_SIZE = 64

_INT8_MAX = 127
_INT4_LEVELS = 15  # codes 0..15


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantized copy of one tensor: packed codes plus per-group scales (and minimums for int4).

    ``nbytes`` is the real byte count of every tensor it holds, scales included.
    """

    mode: Literal["int8", "int4"]
    data: torch.Tensor  # flat codes: int8 [numel] or uint8 [ceil(numel / 2)], two 4-bit codes a byte
    scale: torch.Tensor  # [groups], fp16 or bf16
    minimum: torch.Tensor | None  # [groups] for int4, None for int8
    shape: tuple[int, ...]
    dtype: torch.dtype
    group_size: int
    per_channel: bool = False

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        held = self.data.nbytes + self.scale.nbytes
        return held + (self.minimum.nbytes if self.minimum is not None else 0)

    @property
    def original_nbytes(self) -> int:
        """Bytes the tensor took before quantization (in its own dtype)."""
        return self.numel * self.dtype.itemsize

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "QuantizedTensor":
        """The same quantized tensor with its storage on ``device`` (e.g. parked on the host)."""
        move = lambda x: None if x is None else x.to(device, non_blocking=non_blocking)  # noqa: E731
        return QuantizedTensor(self.mode, move(self.data), move(self.scale), move(self.minimum),
                               self.shape, self.dtype, self.group_size, self.per_channel)

    def dequantize(self, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        """Restore a tensor of the original shape, in ``dtype`` (default: the original) on ``device``.

        The packed codes move first and are expanded on the target device, which keeps the
        host-to-device copy at the quantized size.
        """
        q = self if device is None else self.to(device)
        codes = q.data if self.mode == "int8" else torch.stack((q.data & 0x0F, q.data >> 4), dim=-1)
        rows = codes.reshape(-1)[: self.numel].reshape(_row_shape(self.shape, self.per_channel))
        values = _grouped(rows.float(), self.group_size) * q.scale.float().unsqueeze(1)
        if q.minimum is not None:
            values += q.minimum.float().unsqueeze(1)
        values = values.reshape(rows.shape[0], -1)[:, : rows.shape[1]]
        return _from_rows(values, self.shape, self.per_channel).to(dtype or self.dtype)


@dataclass(frozen=True)
class FullPrecisionTensor:
    """Mode ``"none"``: a plain copy with the same interface as :class:`QuantizedTensor`."""

    data: torch.Tensor

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    @property
    def original_nbytes(self) -> int:
        return self.data.nbytes

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "FullPrecisionTensor":
        return FullPrecisionTensor(self.data.to(device, non_blocking=non_blocking))

    def dequantize(self, device: torch.device | str | None = None,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        # Always a copy: the restored cache may be updated in place, the parked one must not change.
        return self.data.to(device=device or self.data.device, dtype=dtype or self.data.dtype, copy=True)


StoredTensor = Union[QuantizedTensor, FullPrecisionTensor]


def quantize_kv(t: torch.Tensor, mode: Literal["int8", "int4"], group_size: int = DEFAULT_GROUP_SIZE,
                per_channel: bool = False) -> QuantizedTensor:
    """Quantize ``t`` (floating point, finite; K/V as [B, kv_heads, T, head_dim]) in groups.

    ``per_channel`` groups each channel along the token axis (dim -2) instead of along the
    flattened [T, head_dim] block. The result lives on ``t``'s device; call ``.to("cpu")`` to park
    it. Raises ``ValueError`` on an unknown mode, a bad group size (int4 needs an even one), a
    non-float or non-finite tensor.
    """
    _check_args(t, mode, group_size, per_channel)
    rows = _to_rows(t.detach(), per_channel).float()
    groups = _grouped(rows, group_size)
    scale_dtype = torch.float16 if t.dtype == torch.float16 else torch.bfloat16
    if mode == "int8":
        scale = _narrow(groups.abs().amax(dim=1) / _INT8_MAX, scale_dtype, up=True)
        codes = torch.round(groups / _nonzero(scale).unsqueeze(1)).clamp_(-_INT8_MAX, _INT8_MAX)
        data, minimum = _unpadded(codes.to(torch.int8), rows.shape), None
    else:
        minimum = _narrow(groups.amin(dim=1), scale_dtype, up=False)
        scale = _narrow((groups.amax(dim=1) - minimum) / _INT4_LEVELS, scale_dtype, up=True)
        codes = torch.round((groups - minimum.unsqueeze(1)) / _nonzero(scale).unsqueeze(1))
        codes = _unpadded(codes.clamp_(0, _INT4_LEVELS).to(torch.uint8), rows.shape)
        if codes.numel() % 2:  # fill the last byte
            codes = torch.cat((codes, codes.new_zeros(1)))
        data, minimum = codes[0::2] | (codes[1::2] << 4), minimum.to(scale_dtype)  # fresh storage
    return QuantizedTensor(mode, data, scale.to(scale_dtype), minimum, tuple(t.shape), t.dtype,
                           group_size, per_channel)


def park_kv(t: torch.Tensor, mode: KVQuantMode, group_size: int = DEFAULT_GROUP_SIZE,
            device: torch.device | str = "cpu", per_channel: bool = False) -> StoredTensor:
    """Store ``t`` on ``device`` (host by default) in ``mode``; quantization runs where ``t`` lives.

    Use mode ``"none"`` for conv states, which stay in full precision.
    """
    if mode == "none":
        return FullPrecisionTensor(t.detach().to(device, copy=True))
    return quantize_kv(t, mode, group_size, per_channel).to(device)


def _check_args(t: torch.Tensor, mode: str, group_size: int, per_channel: bool) -> None:
    if mode not in ("int8", "int4"):
        raise ValueError(f"KV quantization mode must be 'int8' or 'int4', got {mode!r}")
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if mode == "int4" and group_size % 2:
        raise ValueError(f"int4 packs two values per byte, so group_size must be even, got {group_size}")
    if not isinstance(t, torch.Tensor) or not t.is_floating_point():
        raise ValueError(f"only floating-point tensors can be quantized, got {getattr(t, 'dtype', type(t))}")
    if per_channel and t.dim() < 2:
        raise ValueError(f"per_channel needs a [..., T, channels] tensor, got shape {tuple(t.shape)}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError("cannot quantize a tensor holding inf or nan")


def _row_shape(shape: tuple[int, ...], per_channel: bool) -> tuple[int, int]:
    """[rows, length]: one row per head ([T * head_dim] values), or per channel ([T] values)."""
    if len(shape) < 2:
        return 1, (shape[0] if shape else 1)
    lead = 1
    for s in shape[:-2]:
        lead *= s
    t_len, width = shape[-2], shape[-1]
    return (lead * width, t_len) if per_channel else (lead, t_len * width)


def _to_rows(t: torch.Tensor, per_channel: bool) -> torch.Tensor:
    source = t.transpose(-1, -2) if per_channel else t
    return source.reshape(_row_shape(tuple(t.shape), per_channel))


def _from_rows(rows: torch.Tensor, shape: tuple[int, ...], per_channel: bool) -> torch.Tensor:
    if not per_channel:
        return rows.reshape(shape).contiguous()
    return rows.reshape(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2).contiguous()


def _grouped(rows: torch.Tensor, group_size: int) -> torch.Tensor:
    """[rows, length] -> [rows * ceil(length / group_size), group_size]. Each row's tail is padded
    with its last value, which leaves that group's min, max and absmax unchanged; the padding is
    never stored."""
    n_rows, length = rows.shape
    pad = -length % group_size
    if pad and length:
        rows = torch.cat((rows, rows[:, -1:].expand(n_rows, pad)), dim=1)
    return rows.reshape(-1, group_size)


def _unpadded(codes: torch.Tensor, row_shape: torch.Size) -> torch.Tensor:
    """Grouped codes back to flat row order without the padding, in storage of exactly that size."""
    n_rows, length = row_shape
    return codes.reshape(n_rows, -1)[:, :length].reshape(-1).clone()


def _narrow(x: torch.Tensor, dtype: torch.dtype, up: bool) -> torch.Tensor:
    """``x`` (fp32) rounded to ``dtype`` toward +inf (``up``) or -inf, returned as fp32."""
    r = x.to(dtype)
    wrong_side = (r.float() < x) if up else (r.float() > x)
    toward = torch.full_like(r, float("inf") if up else float("-inf"))
    return torch.where(wrong_side, torch.nextafter(r, toward), r).float()


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    """Scales with zeros replaced by one: a zero scale means a constant group, whose codes are 0."""
    return torch.where(scale == 0, torch.ones_like(scale), scale)
