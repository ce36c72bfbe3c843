"""mPLUG-Owl3's config.json, read without remote code.

A published checkpoint (``mPLUG/mPLUG-Owl3-7B-240728`` for one) has one flat config: the Qwen2 text keys at the top
level (``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``, ``num_key_value_heads``, ``intermediate_size``,
``rope_theta``, ``rms_norm_eps``, ``vocab_size``, ``max_position_embeddings``, ``tie_word_embeddings``), the
``hyper_layers`` list (1-based indices of the decoder layers that also cross-attend to the image), and a
``vision_config`` dict for the SigLIP tower (``hidden_size``, ``intermediate_size``, ``num_hidden_layers``,
``num_attention_heads``, ``patch_size``, ``image_size``, ``layer_norm_eps``). ``architectures`` names
``mPLUGOwl3Model`` and ``model_type`` is ``mplugowl3``. ``vision_config.image_size`` is both the tower's input
side and the processor's crop side; when config.json leaves it out, the checkpoint's layout supplies it (layout.py).
The layout itself is read from the weight names, not from config.json (weights.read_config).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .layout import Layout

ARCHITECTURE = "mPLUGOwl3Model"
MODEL_TYPE = "mplugowl3"

_TEXT_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "vocab_size",
                  "hyper_layers", "vision_config")
_VISION_REQUIRED = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "patch_size")


@dataclass
class VisionConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    layer_norm_eps: float = 1e-6
    num_channels: int = 3
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def tokens_per_image(self) -> int:
        return (self.image_size // self.patch_size) ** 2

    def to_siglip(self):
        """A transformers SiglipVisionConfig, so its embedding and encoder blocks can be reused."""
        from transformers import SiglipVisionConfig

        cfg = SiglipVisionConfig(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                                 num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                                 image_size=self.image_size, patch_size=self.patch_size, num_channels=self.num_channels,
                                 layer_norm_eps=self.layer_norm_eps, hidden_act=self.hidden_act)
        cfg._attn_implementation = "sdpa"
        return cfg


@dataclass
class OwlConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    vocab_size: int
    hyper_layers: list[int]  # 1-based, as published
    vision: VisionConfig
    layout: Layout  # read from the weight names: how hyper layers gate, which projector
    num_key_value_heads: int | None = None
    rope_theta: float = 1000000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = True
    hidden_act: str = "silu"
    eos_token_id: int | list[int] | None = None
    raw: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.num_key_value_heads = self.num_key_value_heads or self.num_attention_heads
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("config.json: hidden_size must be a multiple of num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("config.json: num_attention_heads must be a multiple of num_key_value_heads")
        bad = [i for i in self.hyper_layers if not 1 <= i <= self.num_hidden_layers]
        if bad:
            raise ValueError(f"config.json: hyper_layers {bad} are outside 1..{self.num_hidden_layers}")
        if self.vision.num_hidden_layers < 2:
            raise ValueError("config.json: the vision tower needs at least 2 layers (features come from the "
                             "second-to-last one)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def is_hyper(self, layer_idx: int) -> bool:
        """``layer_idx`` is 0-based; the published ``hyper_layers`` are 1-based."""
        return (layer_idx + 1) in self.hyper_layers

    @property
    def hyper_layer_indices(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_hyper(i)]

    def to_qwen2(self):
        """A transformers Qwen2Config: the engine's caches and session accounting read their shapes from it."""
        from transformers import Qwen2Config

        return Qwen2Config(hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
                           num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
                           num_key_value_heads=self.num_key_value_heads, vocab_size=self.vocab_size,
                           max_position_embeddings=self.max_position_embeddings, rms_norm_eps=self.rms_norm_eps,
                           rope_theta=self.rope_theta, tie_word_embeddings=self.tie_word_embeddings)

    @classmethod
    def from_dict(cls, d: dict, layout: Layout) -> "OwlConfig":
        missing = [k for k in _TEXT_REQUIRED if k not in d]
        vision = d.get("vision_config") or {}
        missing += [f"vision_config.{k}" for k in _VISION_REQUIRED if k not in vision]
        if missing:
            raise ValueError(f"config.json is not an mPLUG-Owl3 config: missing {missing}")
        v = VisionConfig(**{"image_size": layout.crop_size,
                            **{k: vision[k] for k in VisionConfig.__dataclass_fields__ if k in vision}})
        kw = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k not in ("vision", "layout", "raw")}
        kw["hyper_layers"] = [int(i) for i in d["hyper_layers"]]
        # transformers 5 saves the rope as rope_parameters (rope_theta inside it), not as a top-level rope_theta.
        rope = d.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default" or d.get("rope_scaling"):
            raise ValueError(f"config.json: rope scaling {rope or d.get('rope_scaling')} is not supported for "
                             "mPLUG-Owl3 (its MI-Rope uses the plain rope)")
        if "rope_theta" not in d and "rope_theta" in rope:
            kw["rope_theta"] = rope["rope_theta"]
        return cls(vision=v, layout=layout, raw=dict(d), **kw)

    @classmethod
    def from_folder(cls, folder: str | Path, layout: Layout) -> "OwlConfig":
        return cls.from_dict(json.loads((Path(folder) / "config.json").read_text()), layout)


def is_mplug_owl3_config(d: dict) -> bool:
    return d.get("model_type") == MODEL_TYPE or ARCHITECTURE in (d.get("architectures") or [])
