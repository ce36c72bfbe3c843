"""Build a tiny random-init mPLUG-Owl3 checkpoint offline, in one of the layouts Owlet serves.

Same ``config.json`` keys and the same weight names as a published checkpoint of that layout
(engine/models/mplug_owl3/layout.py; ``dynamic-gate`` is ``mPLUG/mPLUG-Owl3-7B-240728``'s: ``self_attn.gate_proj.0.*``,
``vision2text_model.weight|bias`` and an untied ``language_model.lm_head``), with a few small layers: 4 decoder
layers of which 2 are hyper layers, a 3-layer SigLIP tower on 56-pixel crops (16 image tokens), and a locally
trained byte-level BPE tokenizer that carries mPLUG-Owl3's special tokens. Loaded back through
``engine.models.mplug_owl3`` exactly like a downloaded folder, which tells the layout from the weight names.

    .venv/bin/python -m training.tiny_mplug_owl3 OUT_DIR [--layout static-gate]   # build one
    ensure_tiny_mplug_owl3(layout)                                               # cached (tests)
"""
from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

from training.tiny_checkpoint import _DEFAULT_CORPUS, default_cache_dir

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|image|>"]

TINY_CONFIG = dict(
    architectures=["mPLUGOwl3Model"], model_type="mplugowl3",
    hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    hyper_layers=[1, 3], max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0,
    tie_word_embeddings=True, hidden_act="silu", torch_dtype="float32",
    vision_config=dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                       num_attention_heads=2, image_size=56, patch_size=14, layer_norm_eps=1e-6),
)
# Per layout, what its published checkpoints do differently in config.json (7B-240728 unties lm_head).
LAYOUT_CONFIG = {"dynamic-gate": dict(tie_word_embeddings=False), "static-gate": {}}
DEFAULT_LAYOUT = "dynamic-gate"
_TINY_VERSION = 3


def train_owl_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(_DEFAULT_CORPUS) * 4, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|image|>"])


def build_tiny_mplug_owl3(out_dir: str | Path, *, layout: str = DEFAULT_LAYOUT, config_overrides: dict | None = None,
                          seed: int = 0, init_std: float = 0.2) -> Path:
    """Write config.json, model.safetensors (the layout's published names) and the tokenizer to ``out_dir``."""
    import torch
    from safetensors.torch import save_file

    from engine.models.mplug_owl3.config import OwlConfig
    from engine.models.mplug_owl3.layout import LAYOUTS
    from engine.models.mplug_owl3.model import OwlModel
    from engine.models.mplug_owl3.weights import published_state_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_owl_tokenizer()
    raw = json.loads(json.dumps(TINY_CONFIG))
    raw.update(LAYOUT_CONFIG[layout])
    raw.update(config_overrides or {})
    raw["vocab_size"] = len(tokenizer)
    raw["eos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg = OwlConfig.from_dict(raw, LAYOUTS[layout])
    torch.manual_seed(seed)
    model = OwlModel(cfg)
    with torch.no_grad():
        # A wide init keeps a random model's greedy output varied and image-dependent (see tiny_checkpoint.py);
        # gates spread around 0.5 make the hyper layers' image attention matter.
        for name, p in model.language_model.named_parameters():
            if name.endswith((".self_attn.gate", ".self_attn.gate_proj.0.bias")):
                p.normal_(0.0, 1.0)
            elif "norm" not in name:
                p.normal_(0.0, init_std)
    save_file(published_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    tokenizer.save_pretrained(out)
    return out


def ensure_tiny_mplug_owl3(layout: str = DEFAULT_LAYOUT, cache_dir: str | Path | None = None) -> Path:
    """The cached tiny checkpoint folder of ``layout``, built once (atomically, like ensure_tiny_checkpoint)."""
    import transformers

    recipe = [TINY_CONFIG, LAYOUT_CONFIG[layout], layout, _TINY_VERSION, transformers.__version__]
    key = hashlib.sha256(json.dumps(recipe).encode()).hexdigest()[:10]
    root = Path(cache_dir or default_cache_dir()) / "tiny-models"
    final = root / f"mplug_owl3-{layout}-{key}"
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".mplug_owl3-", dir=root))
    try:
        build_tiny_mplug_owl3(tmp, layout=layout)
        try:
            tmp.rename(final)
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="Build a tiny random-init mPLUG-Owl3 checkpoint.")
    ap.add_argument("out_dir", nargs="?", default="tiny-mplug-owl3")
    ap.add_argument("--layout", choices=tuple(LAYOUT_CONFIG), default=DEFAULT_LAYOUT)
    args = ap.parse_args()
    print(build_tiny_mplug_owl3(args.out_dir, layout=args.layout))
