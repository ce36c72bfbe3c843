"""What a checkpoint's ``generation_config.json`` asks of every answer, beyond sampling: the rules the model's own
``generate()`` applies to greedy decoding too, so Owlet must apply them to be exact, or refuse the checkpoint.

- ``repetition_penalty`` (Qwen2-VL and Qwen2.5-VL ship 1.05): the logit of every token already in the sequence,
  prompt included, divided by the penalty when positive and multiplied by it when negative, before the next token is
  chosen. Owlet applies it (``engine.sampler``), as each request's default; a request may set its own.
- The other rules that change which token greedy decoding picks (``no_repeat_ngram_size``, ``bad_words_ids``,
  ``min_new_tokens``, ...) are not implemented: a checkpoint that sets one is refused at load, naming it, since its
  answers would differ from its own ``generate()``; ``OWLET_ALLOW_UNVERIFIED=true`` serves it anyway, without them.

The sampling defaults (``temperature``, ``top_p``, ``top_k``, ``do_sample``) are not rules of this kind: each request
says how it samples (the page's and the API's settings), and greedy is exact whatever they say.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path

log = logging.getLogger("owlet.engine")

# generation_config fields whose logits processor changes greedy tokens, with the value that leaves them off
NOT_APPLIED = {
    "no_repeat_ngram_size": (None, 0),
    "encoder_no_repeat_ngram_size": (None, 0),
    "encoder_repetition_penalty": (None, 1.0),
    "bad_words_ids": (None,),
    "suppress_tokens": (None,),
    "begin_suppress_tokens": (None,),
    "forced_eos_token_id": (None,),
    "sequence_bias": (None,),
    "min_length": (None, 0),
    "min_new_tokens": (None, 0),
    "exponential_decay_length_penalty": (None,),
}


def repetition_penalty(generation_config, folder: str, allow_unverified: bool) -> float:
    """The checkpoint's default repetition penalty (1.0: none), after refusing rules Owlet does not apply."""
    not_applied = {name: getattr(generation_config, name, None) for name, off in NOT_APPLIED.items()
                   if not _off(getattr(generation_config, name, None), off)}
    if not_applied:
        what = ", ".join(f"{name}={value!r}" for name, value in sorted(not_applied.items()))
        message = (f"{folder}: its generation_config.json sets {what}, which the model's own generate() applies to "
                   "every answer and Owlet does not, so its answers would differ from the model's")
        if not allow_unverified:
            raise ValueError(message + ". To serve it anyway, without them, set OWLET_ALLOW_UNVERIFIED=true.")
        log.warning("%s; serving it anyway, without them, because allow_unverified is set", message)
    penalty = getattr(generation_config, "repetition_penalty", None)
    if penalty is None:
        return 1.0
    if not (isinstance(penalty, (int, float)) and math.isfinite(penalty) and penalty > 0):
        raise ValueError(f"{folder}: generation_config.json's repetition_penalty {penalty!r} is not a number above 0")
    return float(penalty)


def _off(value, off: tuple) -> bool:
    """Whether ``value`` leaves its rule off: a neutral value, or an empty list of tokens (``suppress_tokens: []``)."""
    return value in off or (isinstance(value, (list, tuple, dict)) and not value)


def folder_generation_config(folder: str):
    """The checkpoint's generation config read from its folder (an empty one where it ships none), for runners that
    do not load the model through transformers."""
    from transformers import GenerationConfig

    if not (Path(folder) / "generation_config.json").is_file():
        return GenerationConfig()
    return GenerationConfig.from_pretrained(folder, local_files_only=True)
