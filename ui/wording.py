"""Every sentence the page shows about a turn's progress, its stats, and its errors, in one place."""
from __future__ import annotations

from collections.abc import Mapping

# The page saw no event for OWLET_UI_STALL_TIMEOUT_S. (A worker lost twice is reported by the worker side,
# ``worker.reaper.LOST_AFTER_RETRY``, in the job's stream.)
WORKER_LOST = ("The worker handling this answer stopped responding. Please ask again; "
               "if it keeps happening, the service may be restarting.")
STOPPED = "Stopped."
CANCELLED = "Stopped. The answer was cancelled."
NOT_YOUR_SESSION = "This page session belongs to someone else; nothing was changed. Reload the page to start your own."
NOTHING_TO_STOP = "Nothing to stop: no answer of yours is in progress."
ANSWER_FAILED = "The answer failed."  # an error event without a message
NOTHING_TO_RETRY = "Nothing to retry yet."
NOT_YOUR_MESSAGE = "Only your own messages can be retried or edited."
NEVER_SENT = ("That question was refused (the reason is under it), so it was never sent: change what the reason "
              "says and send it again from the box.")
NEEDS_MESSAGE_INDEX = ("Retry and edit come from the chat's buttons: they need the event data {\"index\": N} of one of "
                       "your messages (and \"value\", the new text, for edit). To ask something new, use /chat.")
NEW_CONVERSATION = "New conversation."
THINKING = "Thinking…"
RESTARTED = "The worker answering you was lost; your question was put back in the queue."
RESTORED = "Welcome back: your last conversation is restored."
NO_PICTURE_YET = "No picture in this conversation yet: attach one with 📎 to ask about it"
RESTORED_ANSWERING = "Welcome back: your last conversation is restored, and its answer is on its way."
RECONNECTING = "The chat service is reconnecting to its queue; your answer resumes when it is back…"
SERVICE_DOWN = "The chat service is restarting (its queue is unreachable). Please try again in a moment."
EMPTY_MESSAGE = "Type a question, or attach an image and ask about it."
ONE_IMAGE_ONLY = "Please attach one image per message."
DEFAULT_IMAGE_PROMPT = "Describe this image."


def queued(position: int | None, eta_s: float | None, no_worker: bool = False) -> str:
    """'Queued — position 3, about 12 s' (the ETA is omitted when unknown; with no worker alive, says so)."""
    where = f"position {position}" if position else "waiting for a free slot"
    if no_worker:
        return f"Queued — {where}; no worker is running right now, it starts when one is back"
    if eta_s is None or eta_s < 0:
        return f"Queued — {where}"
    return f"Queued — {where}, about {max(1, round(eta_s))} s"


def too_long(limit: int) -> str:
    return f"Your message is longer than {limit} characters. Please shorten it."


def image_rejected(reason: str) -> str:
    return f"Image rejected: {reason}"


def session_cache_hit(stats: Mapping | None, follow_up: bool) -> bool:
    """Did this turn reuse its conversation's cached KV? The engine may say so (``cache_source``); otherwise
    reused tokens on a follow-up count as a session hit, and on a first turn they can only be the shared
    chat-template prefix, which is not a session hit."""
    stats = stats or {}
    if "cache_source" in stats:
        return stats["cache_source"] == "session"
    return follow_up and (stats.get("cached_tokens") or 0) > 0


def stats_line(stats: Mapping | None, ui_ttft_s: float | None = None, follow_up: bool = False) -> str:
    """'First token 0.21 s · 34.5 tokens/s · 48 tokens · session cache hit (812/830 prompt tokens reused)'."""
    stats = stats or {}
    parts = []
    ttft = ui_ttft_s if ui_ttft_s is not None else stats.get("ttft_s")
    if ttft is not None:
        parts.append(f"First token {ttft:.2f} s")
    tps = stats.get("decode_tokens_per_s")
    if tps:
        parts.append(f"{tps:.1f} tokens/s")
    generated = stats.get("generated_tokens")
    if generated is not None:
        parts.append(f"{generated} tokens")
    cached, prompt = stats.get("cached_tokens") or 0, stats.get("prompt_tokens") or 0
    if session_cache_hit(stats, follow_up):
        parts.append(f"session cache hit ({cached}/{prompt} prompt tokens reused)")
    elif cached:
        parts.append(f"session cache miss ({cached}/{prompt} prompt tokens from the shared prefix)")
    elif prompt:
        parts.append("session cache miss")
    return " · ".join(parts)


def finish_note(finish_reason: str | None) -> str:
    """A short suffix for answers that did not end naturally."""
    return {
        "length": "cut at the length limit",
        "deadline": "cut short: it took too long",
    }.get(finish_reason or "", "")
