"""The mPLUG-Owl3 weight layouts Owlet serves, and how a checkpoint's weight names tell which one it holds.

Releases share the SigLIP tower, the Qwen2 decoder, the hyper layers' ``v_kv_proj``, MI-Rope and the text-to-image
visibility; they differ in two places, both visible in the weight names:

- how a hyper layer mixes its image attention into its self-attention output (before ``o_proj``), for every token
  that sees an image: ``self * (1 - g) + cross * g``, with
  - ``dynamic``: ``g = sigmoid(W ctx_h + b)`` computed per token and per head from that head's own self-attention
    output ``ctx_h`` (``self_attn.gate_proj = Sequential(Linear(head_dim, head_dim), Sigmoid)``);
  - ``static``: one learned value per channel, ``g = sigmoid(self_attn.gate)``;
- the projector from the vision tower to the text width: one ``Linear`` (``vision2text_model.weight``) or
  ``Linear, GELU, Linear`` (``vision2text_model.0.*``, ``vision2text_model.2.*``).

The processor's crop side comes from ``vision_config.image_size`` when config.json carries it, else from the
layout (the 240728 code hard-codes 384 px crops in ``init_processor``).

One engine serves one checkpoint, so rows of different layouts never share a batch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class Layout:
    name: str
    gate: str  # "dynamic" (per token and head, from the self-attention output) or "static" (per channel)
    projector: str  # "linear" (one Linear) or "mlp" (Linear, GELU, Linear)
    crop_size: int  # crop side when config.json's vision_config has no image_size
    gate_key: str  # what each hyper layer's attention holds, under language_model.model.layers.N.
    projector_key: str  # the projector's first weight
    releases: str  # which published checkpoints use it, and how sure that is

    @property
    def summary(self) -> str:
        return f"{self.name} (`layers.N.{self.gate_key}`, `{self.projector_key}`)"


DYNAMIC_GATE = Layout(
    "dynamic-gate", gate="dynamic", projector="linear", crop_size=384,
    gate_key="self_attn.gate_proj.0.weight", projector_key="vision2text_model.weight",
    releases="mPLUG/mPLUG-Owl3-7B-240728 (read from its published modelling code); believed, not verified: "
             "1B/2B-241014, which a public port serves with the same code")
STATIC_GATE = Layout(
    "static-gate", gate="static", projector="mlp", crop_size=378,
    gate_key="self_attn.gate", projector_key="vision2text_model.0.weight",
    releases="Owlet's first reading of the paper; no published checkpoint is known to use it")
LAYOUTS = {layout.name: layout for layout in (DYNAMIC_GATE, STATIC_GATE)}

_DECODER_LAYER = re.compile(r"language_model\.model\.layers\.\d+\.(.+)$")


def detect_layout(names: Iterable[str], where: str = "the checkpoint") -> Layout:
    """The layout whose gate or projector weights ``names`` hold. Anything else the layout expects or does not know
    is named by the strict key check at load (weights.load_weights)."""
    names = set(names)
    layer_keys = {m.group(1) for m in map(_DECODER_LAYER.match, names) if m}
    evidence = {}  # layout name -> the keys of it the checkpoint holds
    for layout in LAYOUTS.values():
        keys = [f"layers.N.{layout.gate_key}"] if layout.gate_key in layer_keys else []
        keys += [layout.projector_key] if layout.projector_key in names else []
        if keys:
            evidence[layout.name] = keys
    if len(evidence) == 1:
        return LAYOUTS[next(iter(evidence))]
    known = "; ".join(layout.summary for layout in LAYOUTS.values())
    if not evidence:
        hyper = sorted(k for k in layer_keys if k.startswith("self_attn.") and not k.startswith(
            ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj.", "self_attn.o_proj")))
        projector = sorted(n for n in names if n.startswith("vision2text_model"))
        raise ValueError(f"{where} fits no supported mPLUG-Owl3 layout ({known}); its hyper-attention keys are "
                         f"{hyper or 'none'} and its projector keys {projector or 'none'}")
    mixed = "; ".join(f"{name} ({keys})" for name, keys in evidence.items())
    raise ValueError(f"{where} mixes mPLUG-Owl3 layouts: {mixed}")
