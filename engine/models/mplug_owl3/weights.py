"""Load the published mPLUG-Owl3 weights (safetensors, single file or sharded) into ``OwlModel``.

The weight names say which layout the checkpoint holds (layout.py); ``read_config`` pairs config.json with it.
Names are used as published, with no renaming: our modules are named after them. A checkpoint key the model does
not know, or a model weight the checkpoint lacks, is an error that names the keys — a silently random weight
would produce fluent nonsense. Known-unused weights are accepted and dropped: the vision tower's last layer,
post-layernorm and pooling head (features come from the second-to-last layer), and a tied ``lm_head``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from .config import OwlConfig
from .layout import detect_layout
from .model import OwlModel

_UNUSED_VISION = ("vision_model.post_layernorm.", "vision_model.head.")


def checkpoint_files(folder: str | Path) -> list[Path]:
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{folder} has no model.safetensors or model.safetensors.index.json "
                            "(only safetensors checkpoints are supported)")


def weight_names(folder: str | Path) -> list[str]:
    """Every weight name of the checkpoint, from the shard index or the safetensors headers (no tensor is read)."""
    from safetensors import safe_open

    index = Path(folder) / "model.safetensors.index.json"
    if index.exists():
        return list(json.loads(index.read_text())["weight_map"])
    names = []
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            names += list(f.keys())
    return names


def read_config(folder: str | Path) -> OwlConfig:
    """config.json with the layout the checkpoint's weight names show; raises ValueError naming the keys when they
    fit no supported layout."""
    return OwlConfig.from_folder(folder, detect_layout(weight_names(folder), where=str(folder)))


def _ignored(name: str, model: OwlModel) -> bool:
    last = f"vision_model.encoder.layers.{model.cfg.vision.num_hidden_layers - 1}."  # not built (see SiglipTower)
    if name.startswith(_UNUSED_VISION) or name.startswith(last):
        return True
    return name == "language_model.lm_head.weight" and model.cfg.tie_word_embeddings


def load_model(cfg, folder: str | Path, dtype: torch.dtype) -> OwlModel:
    """Build the model on the meta device (no random init, no fp32 copy of a 2B model) and load ``folder``."""
    with torch.device("meta"):
        model = OwlModel(cfg)
    load_weights(model, folder, dtype)
    model.vision_model.reset_buffers()
    left = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    assert not left, f"weights left unloaded: {left}"
    return model


def load_weights(model: OwlModel, folder: str | Path, dtype: torch.dtype) -> None:
    """Fill ``model`` (built on the meta device or CPU) from ``folder``; raises ValueError naming bad keys."""
    from safetensors import safe_open

    wanted = set(model.state_dict())
    if model.cfg.tie_word_embeddings:
        wanted.discard("language_model.lm_head.weight")
    loaded: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for path in checkpoint_files(folder):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name in wanted:
                    loaded[name] = f.get_tensor(name).to(dtype)
                elif not _ignored(name, model):
                    unknown.append(name)
    missing = sorted(wanted - loaded.keys())
    if unknown or missing:
        raise ValueError(f"{folder} does not match the mPLUG-Owl3 layout {model.cfg.layout.summary}: "
                         f"unknown keys {sorted(unknown)[:20]}{' ...' if len(unknown) > 20 else ''}; "
                         f"missing keys {missing[:20]}{' ...' if len(missing) > 20 else ''}")
    shapes = model.state_dict()
    wrong = [f"{k}: checkpoint {tuple(v.shape)} vs config {tuple(shapes[k].shape)}"
             for k, v in loaded.items() if v.shape != shapes[k].shape]
    if wrong:
        raise ValueError(f"{folder}: weight shapes disagree with config.json: {wrong[:10]}")
    model.load_state_dict(loaded, strict=False, assign=True)
    if model.cfg.tie_word_embeddings:
        model.language_model.lm_head.weight = model.language_model.model.embed_tokens.weight


def published_state_dict(model: OwlModel) -> dict[str, torch.Tensor]:
    """The weights as the published checkpoint stores them, for the tiny builder: tied lm_head left out, and the
    full SigLIP tower (its last layer, post-layernorm and pooling head, which serving skips) filled with random
    values."""
    from transformers.models.siglip.modeling_siglip import SiglipMultiheadAttentionPoolingHead

    sd = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    if model.cfg.tie_word_embeddings:
        sd.pop("language_model.lm_head.weight", None)
    last = model.cfg.vision.num_hidden_layers - 1
    first = "vision_model.encoder.layers.0."
    for k, v in list(sd.items()):
        if k.startswith(first):
            sd[f"vision_model.encoder.layers.{last}." + k[len(first):]] = torch.randn_like(v) * 0.02
    width = model.cfg.vision.hidden_size
    sd["vision_model.post_layernorm.weight"] = torch.ones(width)
    sd["vision_model.post_layernorm.bias"] = torch.zeros(width)
    head = SiglipMultiheadAttentionPoolingHead(model.cfg.vision.to_siglip())
    sd.update({f"vision_model.head.{k}": v.detach().contiguous().clone() for k, v in head.state_dict().items()})
    return sd
