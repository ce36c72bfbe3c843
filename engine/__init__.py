"""Owlet's inference engine: continuous batching over Hugging Face VLMs with per-conversation KV reuse.

Imports no Celery, Redis or Gradio. See docs/interfaces.md for the contract and llm_engine.py for the loop.

The package is lazy: importing ``engine`` (or its torch-free contract modules ``engine.sampling_params``,
``engine.outputs`` and ``engine.limits``) loads neither torch nor transformers, so the web page, which only
validates sampling parameters and reads results, stays small. ``engine.LLMEngine`` and friends are imported on
first use (PEP 562 module ``__getattr__``).
"""
from __future__ import annotations

import importlib

# public name -> the module that defines it
_EXPORTS = {
    "EngineConfig": "engine.config",
    "LLMEngine": "engine.llm_engine",
    "greedy": "engine.llm_engine",
    "FinalResult": "engine.outputs",
    "FinishReason": "engine.outputs",
    "RequestStats": "engine.outputs",
    "SamplingParams": "engine.sampling_params",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
