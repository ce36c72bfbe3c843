"""Owlet's inference engine: continuous batching over Hugging Face VLMs with per-conversation KV reuse.

Imports no Celery, Redis or Gradio. See docs/interfaces.md for the contract and llm_engine.py for the loop.
"""
from .config import EngineConfig
from .llm_engine import LLMEngine, greedy
from .outputs import FinalResult, FinishReason, RequestStats
from .sampling_params import SamplingParams

__all__ = ["EngineConfig", "LLMEngine", "greedy", "FinalResult", "FinishReason", "RequestStats", "SamplingParams"]
