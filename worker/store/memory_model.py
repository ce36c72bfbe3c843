"""What Owlet stores in Redis, in bytes as Redis's ``MEMORY USAGE`` counts them, and the size a traffic needs.

One source of truth: SUBMIT charges the history budget (``worker.store.history_budget``) with the first four figures
(``worker.queue.scripts`` writes them into the scripts), docs/redis_memory.md explains them all, and
tests/worker/test_redis_memory_model.py makes real keys through the real path, measures them, and checks every
figure here within ``TOLERANCE``.

Measured on Redis 7.0 (jemalloc), with the bookkeeping sets, hashes and zsets at the sizes a running service has
(hundreds of members and more, past their compact encodings).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# A conversation's fixed cost: its hash (owner, created; when its owner left it, 19 B more), its turns list's own
# overhead, the key naming the worker that holds its cache, its owner's newest-conversation pointer, and its members in
# the budget's zset and hash.
CONVERSATION_BYTES = 880
# Each turn (a question or an answer) beyond the length of its JSON (``worker.store.history.turn_json``).
TURN_BYTES = 30
# Each entry of the API's conversation index (``Keys.chat_index``) and its member in ``Keys.chat_indexes_of``.
INDEX_ENTRY_BYTES = 410
# The notice a conversation that gave way leaves its owner (``Keys.cleared``) and its member in ``cleared_held``.
CLEARED_BYTES = 270

# Not charged to the history budget; they live a set time, so the traffic sets how many are held.
# A stored picture beyond its bytes rounded up to the allocator's size class (``allocated``): its key, and its
# members in the pictures' bookkeeping (images_held, image_sizes, image_owners, images_of; picture_jobs only while a
# job about it is live, FINISH takes each out).
PICTURE_BYTES = 1100
# A job's hash beyond its payload (the job as JSON: a follow-up's carries its question, a first question's the
# earlier messages too; worker.store.jobs).
JOB_BYTES = 870
# A job's payload beyond its question's text: the JSON around it, and a follow-up's mark that its history is the
# conversation's.
PAYLOAD_BYTES = 200
FOLLOW_UP_MARK_BYTES = 33
# A question waiting in line beyond its job's hash and stream: its entry in the line and the counters and indexes
# that order and cap it (for a visitor whose client group waits with this one question).
WAITING_BYTES = 1300
# A job's stream is stored in nodes of up to 4 KiB of entries (Redis's stream-node-max-bytes), each taking this
# much; an entry (its queued, started and terminal events, and a token event per ``stream_coalesce_s`` at most)
# takes its text and STREAM_EVENT_BYTES. The terminal event repeats the whole answer.
STREAM_NODE_BYTES = 4800
STREAM_NODE_ENTRIES_BYTES = 4096
STREAM_EVENT_BYTES = 50

# What a visitor's day leaves: an identity's text and picture quotas, for a day from its first charge ...
IDENTITY_BYTES = 224
# ... and a client address's that sent a picture (text and picture quotas, the list and share of the pictures it
# sent; its submit rate, for a minute).
ADDRESS_BYTES = 1400

# How far a measured figure may be from the one above (the allocator's size classes make sizes step).
TOLERANCE = 0.15

JSON_TURN_BYTES = 80  # a turn's JSON beyond its text: {"role", "text", "image_sha", "job_id"}
DAY_S = 24 * 3600


@dataclass(frozen=True)
class Traffic:
    """A day of traffic, as the formula takes it."""
    conversations_per_day: float
    turns_per_conversation: float  # questions, each answered
    question_chars: float = 60
    answer_chars: float = 600
    pictures_per_day: float = 0  # new pictures stored (a follow-up about the same picture stores nothing)
    picture_bytes: int = 250_000
    token_events_per_answer: float = 30
    api_share: float = 0  # the share of conversations held by API clients (each question adds an index entry)
    identities_per_day: float = 0
    addresses_per_day: float = 0


def allocated(n: int) -> int:
    """The bytes jemalloc (Redis's allocator) hands out for a request of ``n``: four size classes per doubling, so a
    large value takes up to a quarter more than its length (an eighth on average)."""
    if n <= 16:
        return 8 if n <= 8 else 16
    spacing = 1 << max(4, (n - 1).bit_length() - 3)
    return -(-n // spacing) * spacing


def stream_bytes(token_events: float, answer_chars: float) -> float:
    """One job's stream: its queued, started and terminal events and ``token_events`` tokens, for an answer of
    ``answer_chars``."""
    entries = (3 + token_events) * STREAM_EVENT_BYTES + 2 * answer_chars
    return STREAM_NODE_BYTES * math.ceil(entries / STREAM_NODE_ENTRIES_BYTES)


def conversation_bytes(t: Traffic) -> float:
    """The bytes one conversation holds once all its turns are answered (as the budget charges them)."""
    turns = 2 * t.turns_per_conversation
    text = t.turns_per_conversation * (t.question_chars + t.answer_chars) + turns * JSON_TURN_BYTES
    return CONVERSATION_BYTES + text + turns * TURN_BYTES + t.api_share * t.turns_per_conversation * INDEX_ENTRY_BYTES


def job_bytes(t: Traffic, earlier_turns: int) -> float:
    """One job's hash and stream, for a question after ``earlier_turns`` answered ones (its payload, the job as
    JSON, carries the question alone: its worker reads the earlier turns from the conversation)."""
    payload = PAYLOAD_BYTES + t.question_chars + (FOLLOW_UP_MARK_BYTES if earlier_turns else 0)
    return JOB_BYTES + payload + stream_bytes(t.token_events_per_answer, t.answer_chars)


def waiting_bytes(payload: int = 300) -> int:
    """What one question waiting in line holds, its conversation aside (the history budget counts that): its job's
    hash with a payload of ``payload`` bytes, its stream (one node, holding the queued event) and its place in line."""
    return JOB_BYTES + payload + STREAM_NODE_BYTES + WAITING_BYTES


def redis_bytes(t: Traffic, history_ttl_s: float, image_ttl_s: float, stream_ttl_s: float,
                ledger_window_s: float = DAY_S, history_budget: float | None = None,
                picture_total: float | None = None) -> dict[str, float]:
    """The bytes Redis holds for traffic ``t`` in steady state, by part (Redis's own few MB aside):

    - history: conversations are held ``history_ttl_s`` from their last turn, or as many as ``history_budget``
      holds, whichever is less;
    - pictures: ``image_ttl_s`` each, or as many as ``picture_total`` (bytes) holds;
    - jobs: each job's hash and stream, ``stream_ttl_s`` after it ended;
    - ledgers: the identities' and addresses' quotas, ``ledger_window_s`` from their first charge.
    """
    history = t.conversations_per_day * history_ttl_s / DAY_S * conversation_bytes(t)
    if history_budget is not None:
        history = min(history, history_budget)
    one_picture = allocated(int(t.picture_bytes)) + PICTURE_BYTES
    pictures_held = t.pictures_per_day * image_ttl_s / DAY_S
    if picture_total is not None:
        pictures_held = min(pictures_held, picture_total / t.picture_bytes)
    pictures = pictures_held * one_picture
    turns = max(1, int(round(t.turns_per_conversation)))
    jobs = t.conversations_per_day * stream_ttl_s / DAY_S * sum(job_bytes(t, k) for k in range(turns))
    ledgers = (t.identities_per_day * IDENTITY_BYTES + t.addresses_per_day * ADDRESS_BYTES) * ledger_window_s / DAY_S
    parts = {"history": history, "pictures": pictures, "jobs": jobs, "ledgers": ledgers}
    return {**parts, "total": sum(parts.values())}


def redis_growth_bytes_per_s(t: Traffic, elapsed_s: float, history_ttl_s: float, image_ttl_s: float,
                             stream_ttl_s: float) -> dict[str, float]:
    """How fast Redis grows ``elapsed_s`` after traffic ``t`` started on an empty one, by part: each part grows at
    its rate until its TTL has passed, then levels off (a soak's slope; the budgets, once reached, level it too).
    Ledgers are left out: they grow with new visitors, not with turns."""
    per_s = 1 / DAY_S
    turns = max(1, int(round(t.turns_per_conversation)))
    rates = {
        "history": t.conversations_per_day * per_s * conversation_bytes(t) if elapsed_s < history_ttl_s else 0.0,
        "pictures": (t.pictures_per_day * per_s * (allocated(int(t.picture_bytes)) + PICTURE_BYTES)
                     if elapsed_s < image_ttl_s else 0.0),
        "jobs": (t.conversations_per_day * per_s * sum(job_bytes(t, k) for k in range(turns))
                 if elapsed_s < stream_ttl_s else 0.0),
    }
    return {**rates, "total": sum(rates.values())}
