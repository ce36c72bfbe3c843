"""The job contract: what one turn asks a worker to do, and its validation.

A job is stored in Redis (hash ``job:<id>``, field ``payload``); Celery messages carry only the job id
and its dispatch number. Payloads are validated again on the worker, because anything can be in Redis.

A follow-up (a question after an answer) carries only its question: its history is the conversation's turns before
it, which the script that starts the job on a worker reads and returns with the payload (``HISTORY_IN_CONVERSATION``).
So a follow-up's job costs Redis the same however long the conversation (a long conversation's every job holding all
of it would hold the conversation again and again). A first question carries its whole history (a stateless
client's earlier messages): the dispatcher reads it to route the question to a worker holding its prompt
(``worker.queue.prefix_routes``).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from worker.errors import InvalidInput
from worker.store.images import SHA256_RE

ROLES = ("system", "user", "assistant")  # a system turn comes from a stateless client (the API)
# A payload field: true when ``messages`` holds the question alone and its history is the conversation's first
# ``turn`` turns.
HISTORY_IN_CONVERSATION = "history_in_conversation"


@dataclass(frozen=True)
class Message:
    role: str
    text: str
    image_sha: str | None = None


@dataclass(frozen=True)
class Job:
    job_id: str
    user: str
    conv: str
    turn: int | None  # index of this job's user turn in the conversation (None: a follow-up, SUBMIT's to give)
    messages: tuple[Message, ...]  # the history up to and including this turn
    sampling: dict = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        earlier = self.messages[:-1]
        if self.turn is None or (len(earlier) == self.turn and any(m.role == "assistant" for m in earlier)):
            # a follow-up: its question alone (with turn None, its client did not read the conversation: the turn is
            # the one SUBMIT appended it as, which the worker gets with the history, ``Started.turn``)
            d["messages"], d[HISTORY_IN_CONVERSATION] = [asdict(self.messages[-1])], True
        else:
            d["messages"] = [asdict(m) for m in self.messages]
        return json.dumps(d, ensure_ascii=False)  # UTF-8 as is: escaped, an emoji takes 12 bytes, not 4


TOO_LONG = "This conversation is too long to continue. Start a new conversation."


def too_many_images(limit: int) -> str:
    return (f"This conversation already holds {limit} images, the most one conversation can use. Start a new "
            "conversation to ask about another image.")


def check_image_count(messages, limit: int) -> None:
    """Refuse a history with more than ``limit`` image turns before any of them is decoded."""
    count = sum(1 for m in messages if m.image_sha)
    _require(count <= limit, too_many_images(limit))


def unencodable(what: str, text: str) -> str | None:
    """The sentence refusing ``text`` (called ``what`` in it) when it has no UTF-8 form, else None. That is text
    holding an unpaired UTF-16 surrogate (U+D800 to U+DFFF alone): a JSON body carries one as an escape ("\\ud800")
    and a browser's text box can hold one, but Redis, the conversation index, the tokenizer and the page's own
    replies all take UTF-8, so such a turn is refused in a sentence before anything reads, stores or echoes it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"{what} holds a character that is not text (an unpaired surrogate, U+{ord(text[exc.start]):04X}, "
                f"at character {exc.start + 1}): remove it and send again.")
    return None


def check_texts_encode(messages, sampling: dict | None) -> None:
    """Refuse a turn whose messages (its question last) or stop strings have no UTF-8 form (``unencodable``)."""
    last = len(messages) - 1
    texts = [("Your question" if i == last else f"Message {i + 1}", m.text) for i, m in enumerate(messages)]
    stops = (sampling or {}).get("stop")
    texts += [("A stop sequence", t) for t in ([stops] if isinstance(stops, str) else stops or ())
              if isinstance(t, str)]
    for what, text in texts:
        refusal = unencodable(what, text)
        if refusal:
            raise InvalidInput(refusal)


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidInput(message)


def parse_job(raw: str | bytes | None, max_turns: int, max_chars: int,
              history: Sequence[str | bytes] | None = None, turn: int | None = None) -> Job:
    """Parse and validate a stored payload; raises InvalidInput with a message the user can act on. ``history``: the
    conversation's turns before the job's question (their stored JSON), as the script that started it read them; a
    follow-up's payload holds the question alone (``HISTORY_IN_CONVERSATION``), and its messages are these turns and
    the question. ``turn``: the question's turn as SUBMIT appended it (``Started.turn``), for a follow-up whose
    payload leaves it to SUBMIT."""
    _require(raw is not None, "The job was not found (it may have expired). Please ask again.")
    try:
        d = json.loads(raw)
    except (TypeError, ValueError):
        raise InvalidInput("The job payload is not valid JSON.") from None
    _require(isinstance(d, dict), "The job payload must be an object.")
    for name in ("job_id", "user", "conv"):
        _require(isinstance(d.get(name), str) and d[name] != "", f"The job field {name!r} must be a non-empty string.")
    if d.get("turn") is not None or d.get(HISTORY_IN_CONVERSATION) is not True:
        turn = d.get("turn")
    _require(isinstance(turn, int) and not isinstance(turn, bool) and turn >= 0,
             "The job field 'turn' must be a non-negative integer.")
    raw_messages = d.get("messages")
    _require(isinstance(raw_messages, list) and raw_messages, "The job must carry its history as a non-empty list.")
    if d.get(HISTORY_IN_CONVERSATION) is True:
        _require(len(raw_messages) == 1, "A follow-up's job must carry its question alone.")
        _require(history is not None and len(history) == turn,
                 "This conversation changed while your question waited (another tab, a retry or an edit). "
                 "Please ask again.")
        try:
            earlier = [json.loads(t) for t in history]
        except (TypeError, ValueError):
            raise InvalidInput("A stored turn of this conversation is not valid JSON.") from None
        raw_messages = earlier + raw_messages
    _require(len(raw_messages) <= max_turns,
             f"The conversation is too long ({len(raw_messages)} turns, limit {max_turns}). Start a new conversation.")
    messages = []
    for m in raw_messages:
        _require(isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("text"), str),
                 "Each history message needs a role (system, user or assistant) and a text string.")
        sha = m.get("image_sha")
        _require(sha is None or (isinstance(sha, str) and SHA256_RE.match(sha) is not None),
                 "An image reference in the history is not a sha256 hex digest.")
        messages.append(Message(m["role"], m["text"], sha))
    _require(messages[-1].role == "user", "The last history message must be the user's question.")
    total = sum(len(m.text) for m in messages)
    _require(total <= max_chars,
             f"The conversation is too long ({total} characters, limit {max_chars}). Start a new conversation.")
    sampling = d.get("sampling") or {}
    _require(isinstance(sampling, dict), "The job field 'sampling' must be an object.")
    return Job(d["job_id"], d["user"], d["conv"], turn, tuple(messages), sampling)
