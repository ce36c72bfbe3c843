"""LFM2's short convolution on a decode step (one new token per row), in five tensor operations.

transformers' LFM2 conv layer decodes through ``causal_conv1d_update``; without the optional ``causal_conv1d``
CUDA package that is a reference in plain torch: the row's state is concatenated with the new input, a grouped
``conv1d`` runs over the L + 1 positions, the state is copied back, and the layer transposes its input and
output around all of it. On a CPU the grouped ``conv1d`` alone costs about half a millisecond a layer (oneDNN
sets up a depthwise convolution for a [rows, hidden, 4] input), and the rest about as much again: together a
twelfth of a 16-row decode step of the "small" bench model on an AVX2 EPYC (``bench.engine --profile``).

The arithmetic is small: shift the [rows, hidden, L] state left by one, write the gated input ``B * x`` at its
end, take each channel's dot with its L kernel taps, gate by ``C``. ``fast_decode`` does exactly that, in place
on the cache's state (the slot pool's, or a ``DynamicCache``'s), and hands everything else (prefill, a cache
that records the past, a model whose cache has no state yet) to the layer's own forward. The dot rounds in
another order than oneDNN's convolution, as any kernel change does; the engine's token-exactness tests compare
it with ``generate()`` on the layer's own code (``cpu_linear.unpacked()`` turns it off on that thread).
"""
from __future__ import annotations

import functools
import logging

import torch

from .cpu_linear import reference_mode

log = logging.getLogger("owlet.engine")


def _is_short_conv(module: torch.nn.Module) -> bool:
    """transformers' LFM2 conv layer (``Lfm2ShortConv``, also inside LFM2-VL): in_proj → B·x → conv → C·y →
    out_proj, with a depthwise ``nn.Conv1d`` and a layer index into the cache."""
    return (type(module).__name__.endswith("ShortConv") and isinstance(getattr(module, "conv", None), torch.nn.Conv1d)
            and isinstance(getattr(module, "in_proj", None), torch.nn.Linear)
            and isinstance(getattr(module, "out_proj", None), torch.nn.Linear) and hasattr(module, "layer_idx"))


def fast_decode(module: torch.nn.Module, own_forward, hidden_states: torch.Tensor, cache=None,
                attention_mask: torch.Tensor | None = None, **kwargs) -> torch.Tensor:
    state = _decode_state(module, hidden_states, cache)
    if state is None:
        return own_forward(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
    if attention_mask is not None:  # as the layer's own code does: padded positions enter as zeros
        hidden_states = (hidden_states * attention_mask[:, :, None]).to(hidden_states.dtype)
    b, c, x = module.in_proj(hidden_states[:, 0]).chunk(3, dim=-1)  # [rows, hidden] each
    state[:, :, :-1] = state[:, :, 1:].clone()  # overlapping ranges: clone the source
    state[:, :, -1] = b * x
    taps = module.conv.weight[:, 0, :]  # [hidden, L]
    y = (state * taps).sum(dim=-1)
    if module.conv.bias is not None:
        y = y + module.conv.bias
    return module.out_proj((c * y)[:, None, :])


def _decode_state(module, hidden_states, cache) -> torch.Tensor | None:
    """The [rows, hidden, L] state to update in place, or None where the layer's own forward must run."""
    if (cache is None or hidden_states.shape[1] != 1 or reference_mode() or torch.is_grad_enabled()
            or hidden_states.device.type != "cpu"):
        return None
    if cache.is_recording_past(module.layer_idx):
        return None
    state = cache.get_conv_state(module.layer_idx, state_idx=0)
    if state is None or state.shape[-1] != module.conv.weight.shape[-1] or state.shape[0] != hidden_states.shape[0]:
        return None
    return state


def install(model: torch.nn.Module) -> int:
    """Give every LFM2 short-conv layer of ``model`` the fast decode step; returns how many layers got it."""
    count = 0
    for module in model.modules():
        if _is_short_conv(module) and not getattr(module.forward, "owlet_fast_decode", False):
            wrapped = functools.partial(fast_decode, module, module.forward)
            wrapped.owlet_fast_decode = True
            module.forward = wrapped
            count += 1
    if count:
        log.info("LFM2 short conv: %d layers decode through the engine's in-place step", count)
    return count
