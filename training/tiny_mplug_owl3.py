"""Build a tiny random-init mPLUG-Owl3 checkpoint offline, in the published layout.

Same ``config.json`` keys and the same weight names as ``mPLUG/mPLUG-Owl3-2B-241014`` (see
engine/mplug_owl3/config.py and weights.py), with a few small layers: 4 decoder layers of which 2 are hyper layers,
a 3-layer SigLIP tower on 56-pixel images (16 image tokens), and a locally trained byte-level BPE tokenizer that
carries mPLUG-Owl3's special tokens. Loaded back through ``engine.mplug_owl3`` exactly like a downloaded folder.

    .venv/bin/python -m training.tiny_mplug_owl3 OUT_DIR        # build one
    ensure_tiny_mplug_owl3()                                     # cached under .cache/tiny-models (tests)
"""
from __future__ import annotations

import hashlib
import json
import shutil
import sys
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
_TINY_VERSION = 2


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


def build_tiny_mplug_owl3(out_dir: str | Path, *, config_overrides: dict | None = None, seed: int = 0,
                          init_std: float = 0.2) -> Path:
    """Write config.json, model.safetensors (published names) and the tokenizer to ``out_dir``."""
    import torch
    from safetensors.torch import save_file

    from engine.mplug_owl3.config import OwlConfig
    from engine.mplug_owl3.model import OwlModel
    from engine.mplug_owl3.weights import published_state_dict

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_owl_tokenizer()
    raw = json.loads(json.dumps(TINY_CONFIG))
    raw.update(config_overrides or {})
    raw["vocab_size"] = len(tokenizer)
    raw["eos_token_id"] = tokenizer.convert_tokens_to_ids("<|im_end|>")
    cfg = OwlConfig.from_dict(raw)
    torch.manual_seed(seed)
    model = OwlModel(cfg)
    with torch.no_grad():
        # A wide init keeps a random model's greedy output varied and image-dependent (see tiny_checkpoint.py);
        # random gates make the hyper layers' image attention matter.
        for name, p in model.language_model.named_parameters():
            if name.endswith(".gate"):
                p.normal_(0.0, 1.0)
            elif "norm" not in name:
                p.normal_(0.0, init_std)
    save_file(published_state_dict(model), str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(raw, indent=2))
    tokenizer.save_pretrained(out)
    return out


def ensure_tiny_mplug_owl3(cache_dir: str | Path | None = None) -> Path:
    """The cached tiny checkpoint folder, built once (atomically, like ensure_tiny_checkpoint)."""
    import transformers

    key = hashlib.sha256(json.dumps([TINY_CONFIG, _TINY_VERSION, transformers.__version__]).encode()).hexdigest()[:10]
    root = Path(cache_dir or default_cache_dir()) / "tiny-models"
    final = root / f"mplug_owl3-{key}"
    if (final / "config.json").exists():
        return final
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".mplug_owl3-", dir=root))
    try:
        build_tiny_mplug_owl3(tmp)
        try:
            tmp.rename(final)
        except OSError:
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


if __name__ == "__main__":
    print(build_tiny_mplug_owl3(sys.argv[1] if len(sys.argv) > 1 else "tiny-mplug-owl3"))
