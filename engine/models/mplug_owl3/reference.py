"""A plain, unbatched, uncached mPLUG-Owl3 forward and greedy decoding loop: the ground truth for tests.

Written for reading, not speed: every step reruns the whole sequence, attention is spelled out with matmul and
softmax, and each token's image attention is computed over exactly the images placed before it. The gate follows
the checkpoint's layout (layout.py), spelled out with the layout's weights: per token and head from that head's
self-attention output (``dynamic``, the 7B-240728 code), or one learned value per channel (``static``). It shares
only the weights (and the SigLIP tower) with the serving path in model.py/runner.py, not its batching, masks,
caches or gate code.
"""
from __future__ import annotations

import math

import torch

from .model import OwlModel


def _rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [heads, T, D] at positions [T]: pairs (i, i + D/2) turn by pos * theta^(-2i/D)."""
    d = x.shape[-1]
    angle = positions.float()[:, None] * theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    cos, sin = angle.cos(), angle.sin()
    a, b = x.float()[..., : d // 2], x.float()[..., d // 2:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1).to(x.dtype)


def _attend(q, k, v, allowed) -> torch.Tensor:
    """q [H, Tq, D], k/v [H, Tk, D], allowed [Tq, Tk] bool -> [Tq, H * D]."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
    return out.transpose(0, 1).reshape(q.shape[1], -1)


@torch.inference_mode()
def reference_logits(model: OwlModel, token_ids: list[int], image_feats: torch.Tensor | None,
                     image_starts: list[int]) -> torch.Tensor:
    """Logits [T, vocab] for the whole sequence; image j's ``<|image|>`` token is at ``image_starts[j]``."""
    cfg, lm = model.cfg, model.language_model.model
    heads, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    rep = heads // kvh
    n = len(token_ids)
    positions = torch.arange(n)
    x = lm.embed_tokens(torch.tensor(token_ids))
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for idx, layer in enumerate(lm.layers):
        att = layer.self_attn
        h = layer.input_layernorm(x)
        q = _rope(att.q_proj(h).view(n, heads, d).transpose(0, 1), positions, cfg.rope_theta)
        k = _rope(att.k_proj(h).view(n, kvh, d).transpose(0, 1), positions, cfg.rope_theta)
        v = att.v_proj(h).view(n, kvh, d).transpose(0, 1)
        context = _attend(q, k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0), causal)
        if cfg.is_hyper(idx) and image_starts:
            context = _mix_images(att, layer.input_layernorm(image_feats), image_starts, q, context, cfg)
        x = x + att.o_proj(context)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.language_model.lm_head(lm.norm(x))


def _mix_images(att, normed_feats, starts, q, context, cfg):
    heads, kvh, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    lv = normed_feats.shape[1]
    keys, values = [], []
    for j, start in enumerate(starts):
        kv = att.v_kv_proj(normed_feats[j]).view(lv, kvh, 2, d)
        # MI-Rope: every key of image j turns as if at the position right after its <|image|> token.
        keys.append(_rope(kv[:, :, 0].transpose(0, 1), torch.full((lv,), start + 1), cfg.rope_theta))
        values.append(kv[:, :, 1].transpose(0, 1))
    mixed = context.clone()
    for t in range(q.shape[1]):
        seen = [j for j, s in enumerate(starts) if s < t]  # a token sees the images placed before it
        if not seen:
            continue
        k = torch.cat([keys[j] for j in seen], dim=1).repeat_interleave(heads // kvh, 0)
        v = torch.cat([values[j] for j in seen], dim=1).repeat_interleave(heads // kvh, 0)
        cross = _attend(q[:, t:t + 1], k, v, torch.ones(1, k.shape[1], dtype=torch.bool))[0]
        gate = _gate(att, cfg.layout.gate, context[t], d)
        mixed[t] = context[t] * (1 - gate) + cross * gate
    return mixed


def _gate(att, kind: str, context_t: torch.Tensor, head_dim: int) -> torch.Tensor:
    """The image share for one token whose self-attention output (heads concatenated) is ``context_t``."""
    if kind == "static":
        return torch.sigmoid(att.gate)
    # dynamic: each head's slice goes through the same Linear(head_dim, head_dim) and a sigmoid
    linear = att.gate_proj[0]
    per_head = context_t.view(-1, head_dim)
    return torch.sigmoid(per_head @ linear.weight.T + linear.bias).reshape(-1)


@torch.inference_mode()
def greedy_generate(model: OwlModel, token_ids: list[int], pixel_values: torch.Tensor | None,
                    image_starts: list[int], max_new_tokens: int, eos_ids: set[int]) -> list[int]:
    """Greedy tokens for one prompt, rerunning the full sequence every step."""
    feats = model.encode_images(pixel_values) if image_starts else None
    ids, out = list(token_ids), []
    for _ in range(max_new_tokens):
        token = int(reference_logits(model, ids, feats, image_starts)[-1].argmax())
        out.append(token)
        if token in eos_ids:
            break
        ids.append(token)
    return out
