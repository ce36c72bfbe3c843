"""mPLUG-Owl3 as plain torch modules, named after the published weights.

    vision_model.embeddings.*, vision_model.encoder.layers.N.*     SigLIP tower (transformers blocks)
    vision2text_model.*                                            projector: Linear, or Linear, GELU, Linear
    language_model.model.embed_tokens / layers.N.* / norm          Qwen2 decoder with hyper-attention layers
    language_model.lm_head                                         (absent when tied to embed_tokens)

Hyper attention (arXiv 2408.04840): at the layers listed in ``hyper_layers`` the text queries, besides causal
self-attention, attend to the image features of every image placed *before* them. The image keys and values come
from the layer's own ``v_kv_proj`` applied to the image features after the layer's ``input_layernorm`` (shared with
the text); keys are rotated with the rope of the image's position in the text (MI-Rope: the position right after
its ``<|image|>`` token). The two attention outputs (heads concatenated, before ``o_proj``) are mixed by a gate,
``self * (1 - g) + cross * g``, whose form is the checkpoint's layout (layout.py): computed per token and head from
the head's self-attention output (``gate_proj``), or one learned value per channel (``gate``). Tokens that see no
image keep the plain self-attention output.

Everything here is batched over rows; per-row state (caches, image K/V) is passed in, never held.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .config import OwlConfig


# -- rope -----------------------------------------------------------------------------------------------
def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape [*positions.shape, head_dim], computed in fp32 (the published MI-Rope does the same)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [..., D] by cos/sin broadcastable to it; math in fp32, result in x's dtype."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


# -- per-batch image state ---------------------------------------------------------------------------------
@dataclass
class ImageKV:
    """One hyper layer's image keys/values for a batch: rows padded to the same slot count.

    ``slot_image[b, n]`` is the row-local index of the image slot n belongs to; padding slots hold a huge index so
    no query ever sees them. A query token that has ``visible`` images before it sees slots with index < visible.
    """
    keys: torch.Tensor  # [B, kv_heads, N, D], MI-Rope applied
    values: torch.Tensor  # [B, kv_heads, N, D]
    slot_image: torch.Tensor  # [B, N] long

    PAD_INDEX = 1 << 30


# -- language model -------------------------------------------------------------------------------------------
class HyperAttention(nn.Module):
    def __init__(self, cfg: OwlConfig, layer_idx: int):
        super().__init__()
        h, d, kvh = cfg.hidden_size, cfg.head_dim, cfg.num_key_value_heads
        self.layer_idx, self.heads, self.kv_heads, self.head_dim, self.theta = (
            layer_idx, cfg.num_attention_heads, kvh, d, cfg.rope_theta)
        self.q_proj = nn.Linear(h, cfg.num_attention_heads * d, bias=True)
        self.k_proj = nn.Linear(h, kvh * d, bias=True)
        self.v_proj = nn.Linear(h, kvh * d, bias=True)
        self.o_proj = nn.Linear(cfg.num_attention_heads * d, h, bias=False)
        self.is_hyper = cfg.is_hyper(layer_idx)
        self.gate_kind = cfg.layout.gate
        if self.is_hyper:
            self.v_kv_proj = nn.Linear(h, kvh * d * 2, bias=True)
            if self.gate_kind == "dynamic":
                self.gate_proj = nn.Sequential(nn.Linear(d, d, bias=True), nn.Sigmoid())
            else:
                self.gate = nn.Parameter(torch.zeros(h))

    def image_kv(self, normed_feats: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys/values [kv_heads, n_img * Lv, D] for images [n_img, Lv, hidden] (already input-layernormed)
        placed at text ``positions`` [n_img]. The projection's output is laid out (head, key|value, dim)."""
        n, lv, _ = normed_feats.shape
        kv = self.v_kv_proj(normed_feats).view(n, lv, self.kv_heads, 2, self.head_dim)
        keys, values = kv[..., 0, :], kv[..., 1, :]  # [n, Lv, kvh, D]
        cos, sin = rope_cos_sin(positions, self.head_dim, self.theta)  # [n, D]
        keys = apply_rope(keys, cos[:, None, None, :], sin[:, None, None, :])
        flat = lambda t: t.permute(2, 0, 1, 3).reshape(self.kv_heads, n * lv, self.head_dim)  # noqa: E731
        return flat(keys), flat(values)

    def forward(self, x, cos, sin, key_mask, cache, images: ImageKV | None, visible):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = cache.update(k, v, self.layer_idx)
        rep = self.heads // self.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        total = k.shape[2]
        # Query i of this chunk sits at padded index total - t + i; it sees real keys at or before it.
        causal = torch.arange(total, device=x.device)[None, :] <= (total - t + torch.arange(t, device=x.device))[:, None]
        mask = causal[None, None] & key_mask[:, None, None, :].bool()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out = out.transpose(1, 2).reshape(b, t, -1)
        if self.is_hyper and images is not None and images.keys.shape[2] > 0:
            out = self._mix_image_attention(q, out, images, visible)
        return self.o_proj(out)

    def _mix_image_attention(self, q, self_out, images: ImageKV, visible):
        b, _, t, _ = q.shape
        rep = self.heads // self.kv_heads
        k, v = images.keys.repeat_interleave(rep, dim=1), images.values.repeat_interleave(rep, dim=1)
        sees = images.slot_image[:, None, :] < visible[:, :, None]  # [B, T, N]
        any_image = sees.any(-1)  # [B, T]
        # Rows or tokens that see no image would be all-masked (NaN); give them slot 0 and discard the result.
        safe = sees | ~any_image[..., None]
        cross = F.scaled_dot_product_attention(q, k, v, attn_mask=safe[:, None])
        cross = cross.transpose(1, 2).reshape(b, t, -1)
        g = self.gate_values(self_out)
        mixed = self_out * (1 - g) + cross * g
        return torch.where(any_image[..., None], mixed, self_out)

    def gate_values(self, self_out: torch.Tensor) -> torch.Tensor:
        """The image share g, broadcastable to ``self_out`` [B, T, heads * D]: per token and head from each head's
        own slice of the self-attention output (dynamic), or one learned value per channel (static)."""
        if self.gate_kind == "dynamic":
            b, t, _ = self_out.shape
            return self.gate_proj(self_out.view(b, t, self.heads, self.head_dim)).view(b, t, -1)
        return torch.sigmoid(self.gate).to(self_out.dtype)


class MLP(nn.Module):
    def __init__(self, cfg: OwlConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: OwlConfig, layer_idx: int):
        super().__init__()
        self.self_attn = HyperAttention(cfg, layer_idx)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, x, cos, sin, key_mask, cache, images, visible):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, key_mask, cache, images, visible)
        return x + self.mlp(self.post_attention_layernorm(x))


class HyperQwen2(nn.Module):
    def __init__(self, cfg: OwlConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList([DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LanguageModel(nn.Module):
    def __init__(self, cfg: OwlConfig):
        super().__init__()
        self.cfg = cfg
        self.model = HyperQwen2(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids, positions, key_mask, cache, images: dict[int, ImageKV] | None, visible,
                last_only: bool = True) -> torch.Tensor:
        """Logits for ``input_ids`` [B, T] at ``positions`` [B, T]; ``key_mask`` [B, cache + T] marks real
        tokens; ``cache`` (a DynamicCache) gains the new K/V; ``images`` maps hyper layer -> ImageKV;
        ``visible`` [B, T] counts the images each query token sees."""
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, key_mask, cache, (images or {}).get(i), visible)
        x = self.model.norm(x[:, -1:] if last_only else x)
        return self.lm_head(x)


# -- vision -----------------------------------------------------------------------------------------------------
class SiglipTower(nn.Module):
    """SigLIP embeddings + encoder. mPLUG-Owl3 reads the second-to-last layer's output, so the tower is built
    without the last layer; that layer and the post-layernorm/head in the checkpoint are skipped on load."""

    def __init__(self, cfg: OwlConfig):
        super().__init__()
        from transformers.models.siglip.modeling_siglip import SiglipEncoder, SiglipVisionEmbeddings

        sig = cfg.vision.to_siglip()
        sig.num_hidden_layers -= 1
        self.embeddings = SiglipVisionEmbeddings(sig)
        self.encoder = SiglipEncoder(sig)

    def reset_buffers(self) -> None:
        """Recreate the non-persistent patch-position ids (needed after building on the meta device)."""
        emb = self.embeddings
        emb.position_ids = torch.arange(emb.num_positions, device=emb.position_embedding.weight.device)[None]

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.embeddings(pixel_values)
        for layer in self.encoder.layers:
            x = layer(x, None)
        return x


class OwlModel(nn.Module):
    def __init__(self, cfg: OwlConfig):
        super().__init__()
        self.cfg = cfg
        self.vision_model = SiglipTower(cfg)
        if cfg.layout.projector == "linear":
            self.vision2text_model = nn.Linear(cfg.vision.hidden_size, cfg.hidden_size)
        else:
            self.vision2text_model = nn.Sequential(nn.Linear(cfg.vision.hidden_size, cfg.hidden_size), nn.GELU(),
                                                   nn.Linear(cfg.hidden_size, cfg.hidden_size))
        self.language_model = LanguageModel(cfg)

    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Projected image features [n_img, tokens_per_image, hidden] for pixel_values [n_img, 3, S, S]."""
        dtype = next(self.vision2text_model.parameters()).dtype
        return self.vision2text_model(self.vision_model(pixel_values.to(dtype)))

    def image_kv(self, layer_idx: int, feats: torch.Tensor, positions: torch.Tensor):
        """Cross-attention keys/values of hyper layer ``layer_idx`` for images ``feats`` at text ``positions``."""
        layer = self.language_model.model.layers[layer_idx]
        return layer.self_attn.image_kv(layer.input_layernorm(feats), positions)
