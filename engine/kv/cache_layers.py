"""A text model's cache layers: their kinds and what their K/V cost per token.

Three kinds of layer keep decode state, and the engine treats each differently:

- ``full``: attention over every earlier position; keys/values [B, kv_heads, T, head_dim] (transformers'
  ``DynamicLayer``, ``layer_types`` entry ``full_attention``);
- ``sliding``: attention over the last ``sliding_window - 1`` positions only (``DynamicSlidingWindowLayer``);
- ``conv``: LFM2's short convolution, one state [B, hidden, L] per row with no time axis
  (``LinearAttentionCacheLayerMixin``, ``layer_types`` entry ``conv``).

The kinds are read two ways: from a text config's ``layer_types`` (what the slot pool allocates) and from the
layer objects of a ``DynamicCache`` (what engine/kv/kv_cache.py operates on). ``kv_bytes_per_token`` is the one
place that prices a cached token; the slot pool's sizing and the session store's reserve both use it.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin


def is_conv(layer) -> bool:
    """A cache layer holding a conv state (no time axis), e.g. LFM2's."""
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def is_sliding(layer) -> bool:
    """A cache layer holding only the last ``sliding_window - 1`` positions."""
    return isinstance(layer, DynamicSlidingWindowLayer)


def layer_types(text_config) -> list[str]:
    """The config's ``layer_types`` (``full_attention``, ``conv``, ``sliding_attention``, ...), one per layer."""
    return list(getattr(text_config, "layer_types", None) or ["full_attention"] * text_config.num_hidden_layers)


def kv_heads_and_dim(text_config) -> tuple[int, int]:
    """(key/value heads, head dim) of the config's attention layers."""
    heads = getattr(text_config, "num_key_value_heads", None) or text_config.num_attention_heads
    head_dim = getattr(text_config, "head_dim", None) or text_config.hidden_size // text_config.num_attention_heads
    return heads, head_dim


def kv_bytes_per_token(text_config, dtype: torch.dtype) -> int:
    """Attention K/V bytes one token occupies across all layers (conv layers hold no per-token state)."""
    heads, head_dim = kv_heads_and_dim(text_config)
    n_attn = sum(t != "conv" for t in layer_types(text_config))
    return 2 * n_attn * heads * head_dim * torch.tensor([], dtype=dtype).element_size()


def cache_layer_kinds(text_config) -> set[str]:
    """The kinds of cache layer this text config makes: full, sliding, conv (anything else by class name)."""
    kinds = set()
    for layer in DynamicCache(config=text_config).layers:
        if is_conv(layer):
            kinds.add("conv")
        elif is_sliding(layer):
            kinds.add("sliding")
        elif type(layer).__name__ == "DynamicLayer":
            kinds.add("full")
        else:
            kinds.add(type(layer).__name__)
    return kinds
