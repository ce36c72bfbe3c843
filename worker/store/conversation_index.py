"""Which stored conversation a stateless request continues.

A stateless client (the OpenAI-compatible API) sends the whole conversation with every request, and keeps no
conversation id. Owlet still stores each conversation, so that a follow-up reuses the worker's session cache
(``engine.kv.session_store``): the step that admits a request (SUBMIT) remembers its messages (the question included)
under their sha256, per identity (``Keys.chat_index``), and lists that entry with the conversation, which takes it
along when it gives way to the history budget. The next request sends the same messages again plus the
answer and a new question; its earlier messages, without that answer, hash to the same digest, which names the
conversation.

A digest only names a candidate. The conversation is continued only if it is the identity's own, no answer in it
is still being made, and its stored turns equal the request's earlier messages exactly (role, text and picture):
an answer edited by the client, a conversation cut back on the page, or one that expired or gave way starts a new
conversation instead. Keyed by identity, so two keys never share a conversation, even for identical messages.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import redis

from worker.store.history import ConversationStore
from worker.store.jobs import Message
from worker.store.keys import LIVE_STATES, ConvField, JobField, Keys


def digest(messages: Sequence[Message]) -> str:
    """The sha256 of ``messages`` (role, text and picture of each, in order)."""
    canonical = json.dumps([[m.role, m.text, m.image_sha] for m in messages], ensure_ascii=False,
                           separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def as_messages(turns: Sequence[dict]) -> tuple[Message, ...]:
    """Stored turns as the messages a client would send for them."""
    return tuple(Message(t.get("role"), t.get("text"), t.get("image_sha")) for t in turns)


class ConversationIndex:
    def __init__(self, r: redis.Redis, keys: Keys, convs: ConversationStore, ttl_s: int):
        self.r, self.keys, self.convs, self.ttl_s = r, keys, convs, ttl_s

    def find(self, user: str, earlier: Sequence[Message]) -> str | None:
        """The identity's conversation whose turns are exactly ``earlier``, with no answer in progress; else None."""
        if not earlier:
            return None
        asked = earlier[:-1] if earlier[-1].role == "assistant" else earlier  # what was sent, before its answer
        conv = self.r.get(self.keys.chat_index(user, digest(asked)))
        if conv is None:
            return None
        conv = conv.decode()
        if self.convs.owner(conv) != user or self._answering(conv):
            return None
        if as_messages(self.convs.turns(conv)) != tuple(earlier):
            return None
        return conv

    def _answering(self, conv: str) -> bool:
        pending = self.r.hget(self.keys.conversation(conv), ConvField.pending)
        if pending is None:
            return False
        state = self.r.hget(self.keys.job(pending.decode()), JobField.state)
        return state is not None and state.decode() in LIVE_STATES
