"""The shapes the API answers with: a chat completion, its stream of chunks (server-sent events), usage, models.

A completion's id is ``chatcmpl-<job id>``: the job's stream in Redis holds its whole history (``worker.store.streams``).
Beside OpenAI's fields an answer carries ``owlet``: the engine's stats for it (prompt and cached tokens, time to
first token, whether the conversation's session cache was hit), as the page's status line shows them.
"""
from __future__ import annotations

import json
import time

from ui.shared.wording import session_cache_hit

DONE = b"data: [DONE]\n\n"
KEEP_ALIVE = b": keep-alive\n\n"  # an SSE comment: clients skip it; proxies see the connection is alive
# The engine's finish reasons (engine.outputs.FinishReason) as OpenAI's.
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}


def completion_id(job: str) -> str:
    return f"chatcmpl-{job}"


def usage(stats: dict | None) -> dict:
    """OpenAI's usage object from the engine's stats; cached prompt tokens are the session cache's reuse."""
    stats = stats or {}
    prompt, generated = int(stats.get("prompt_tokens") or 0), int(stats.get("generated_tokens") or 0)
    return {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated,
            "prompt_tokens_details": {"cached_tokens": int(stats.get("cached_tokens") or 0)}}


def owlet_stats(stats: dict | None, follow_up: bool, first_token_s: float | None) -> dict:
    """The answer's stats as the page's status line has them: ``session_cache_hit``, the engine's own fields, and
    ``first_token_s`` as the client saw it (queueing included)."""
    stats = dict(stats or {})
    return {"session_cache_hit": session_cache_hit(stats, follow_up), "first_token_s": first_token_s, **stats}


def completion(job: str, model: str, created: int, text: str, finish_reason: str | None, stats: dict | None,
               extra: dict) -> dict:
    return {"id": completion_id(job), "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                         "logprobs": None, "finish_reason": FINISH_REASONS.get(finish_reason or "", "stop")}],
            "usage": usage(stats), "system_fingerprint": None, "owlet": extra}


def chunk(job: str, model: str, created: int, delta: dict, finish_reason: str | None = None, **fields) -> dict:
    """One chunk of a streamed completion (``choices`` empty for the usage chunk, which passes ``choices=[]``)."""
    body = {"id": completion_id(job), "object": "chat.completion.chunk", "created": created, "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}
    body.update(fields)
    return body


def sse(payload: dict) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def model_object(name: str, created: int | None = None) -> dict:
    return {"id": name, "object": "model", "created": int(created if created is not None else time.time()),
            "owned_by": "owlet"}


def model_list(names: list[str], created: int) -> dict:
    return {"object": "list", "data": [model_object(name, created) for name in names]}
