"""Runner: what the engine needs of the code that runs a model.

Two implementations: ``ModelRunner`` (engine/models/model_runner.py), for the Hugging Face families, and ``OwlRunner``
(engine/models/mplug_owl3/runner.py), Owlet's own mPLUG-Owl3. The family row names the one a checkpoint gets
(``Family.runner`` in engine/models/families.py); ``LLMEngine``, the decode batches and the session store use it only
through these members.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from ..kv.byte_lru import ByteLRU
from ..batch.decode_batch import DecodeBatch
from .families import Family


@runtime_checkable
class Runner(Protocol):
    family: Family  # the registry row it serves (it also picks the decode batch)
    model: torch.nn.Module  # the loaded model (the slot batch installs its decode attention on it)
    device: torch.device
    dtype: torch.dtype
    processor: object  # the chat template, tokenizer and image processor (``engine.prompt.PromptBuilder``)
    image_token_id: int  # the token each image feature takes the place of
    image_placeholder: str | None  # the text the chat template writes per image, when not the image token itself
    text_config: object  # the text model's config: cache layer kinds and sizes (engine/kv/cache_layers.py)
    max_model_len: int  # the context (prompt + answer) in tokens
    eos_ids: set[int]
    repetition_penalty: float  # its generation_config.json's, each request's default (1.0: none)
    image_features: ByteLRU  # encoded images by content hash
    weight_bytes: int
    weight_copy_bytes: int  # extra copies of weights its kernels made (engine/models/cpu/)
    session_store_class: type  # the SessionStore (sub)class the engine keeps this model's sessions in

    def prefill(self, request, n_tokens: int) -> torch.Tensor:
        """Run the next ``n_tokens`` prompt tokens of ``request`` through its private cache; the last logits."""

    def can_prefill_together(self, request) -> bool:
        """Whether ``request`` may be prefilled in one forward with others this step (engine/batch/prefill_batch.py)."""

    def prefill_together(self, requests: list, n_tokens: list[int]) -> list[torch.Tensor]:
        """Prefill several requests that ``can_prefill_together`` in one forward; each one's last logits."""

    def decode(self, batch: DecodeBatch) -> tuple[torch.Tensor, object]:
        """One decode step for every row of ``batch``: (logits [B, vocab], the cache to advance the batch with)."""
