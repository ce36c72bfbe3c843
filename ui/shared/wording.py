"""Every sentence the page shows about a turn's progress, its stats, and its errors, in one place.

The status line speaks to visitors: where they are in line and for about how long, that the answer took so long,
what to change about a picture that was refused. The figures behind an answer (time to first token, tokens/s, how
much of the prompt the conversation's cache supplied) stay one click away, in a toggle after the sentence.
"""
from __future__ import annotations

from collections.abc import Mapping

# The page saw no event for OWLET_UI_STALL_TIMEOUT_S. (A worker lost twice is reported by the worker side,
# ``worker.queue.reaper.LOST_AFTER_RETRY``, in the job's stream.)
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
RESTARTED = "The worker answering you was lost; your question was put back in line."
STARTING = "Your answer is starting…"  # sent to a worker, which has not started it yet
NO_WORKER = "The service is restarting; your answer starts when it is back"  # no worker alive: no time to give
RESTORED = "Welcome back: your last conversation is restored."
NO_PICTURE_YET = "No picture in this conversation yet: attach one to ask about it"
RESTORED_ANSWERING = "Welcome back: your last conversation is restored, and its answer is on its way."
RECONNECTING = "The chat service is reconnecting to its queue; your answer resumes when it is back…"
SERVICE_DOWN = "The chat service is restarting (its queue is unreachable). Please try again in a moment."
EMPTY_MESSAGE = "Type a question, or attach an image and ask about it."
ONE_IMAGE_ONLY = "Please attach one image per message."
DEFAULT_IMAGE_PROMPT = "Describe this image."


# Marks in front of a waiting bubble and of a failure. Plain text symbols that ordinary fonts have: a page must not
# depend on an emoji font (without one, an emoji shows as an empty box).
WAITING_MARK = "◷"
WARNING_MARK = "⚠"


def waiting(line: str) -> str:
    """The bubble under a question while its answer has not begun."""
    return f"{WAITING_MARK} {line}"


def warning(sentence: str) -> str:
    """A failure, as the status line and the chat show it."""
    return f"{WARNING_MARK} {sentence}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, ... 11th, 12th, 13th, ... 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def about(seconds: float) -> str:
    """A wait as a person says it: 'about 4 s', 'about 2 min'."""
    if seconds < 90:
        return f"about {max(1, round(seconds))} s"
    return f"about {round(seconds / 60)} min"


def queued(position: int | None, eta_s: float | None, no_worker: bool = False) -> str:
    """'You are 3rd in line, about 12 s' (the time is left out while unknown; with no worker alive, says so).

    Without a position the question has left the line and waits for the worker it was sent to."""
    if not position:
        return STARTING
    where = "You are next in line" if position == 1 else f"You are {ordinal(position)} in line"
    if no_worker:
        return f"{where}. {NO_WORKER}"
    if eta_s is None or eta_s < 0:
        return where
    return f"{where}, {about(eta_s)}"


# How every line of a question waiting for its answer begins (``queued``, and after a lost worker).
WAITING_STARTS = ("You are ", STARTING, RESTARTED)


def too_long(limit: int) -> str:
    return f"Your message is longer than {limit} characters. Please shorten it."


def took(seconds: float) -> str:
    """'0.04 s', '0.5 s', '12 s', '2 min 5 s'."""
    if seconds < 0.095:
        return f"{seconds:.2f} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{round(seconds)} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def answered(total_s: float | None, stats: Mapping | None, ui_ttft_s: float | None = None, follow_up: bool = False,
             finish_reason: str | None = None) -> str:
    """The line after an answer: 'Answered in 0.5 s', how it ended if not by itself, then the figures in a
    toggle (``stats_line``), closed until the visitor opens it."""
    headline = "Answered" if total_s is None else f"Answered in {took(total_s)}"
    note = finish_note(finish_reason)
    if note:
        headline = f"{headline}, {note}"
    figures = stats_line(stats, ui_ttft_s, follow_up)
    if not figures:
        return headline
    return f"{headline} {FIGURES_OPEN}{figures}{FIGURES_CLOSE}"


# The figures' toggle: HTML inside the status line's Markdown (closed <details> are not shown until clicked).
FIGURES_OPEN = '<details class="owlet-figures"><summary>details</summary>'
FIGURES_CLOSE = "</details>"


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
        "length": "cut short at its length limit (Settings: Longest answer)",
        "deadline": "cut short: it took too long",
    }.get(finish_reason or "", "")
