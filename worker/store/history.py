"""Conversation history in Redis: the source of truth for turns, image refs and answers.

A conversation is a hash (owner, pending job) plus a list of JSON turns. Ownership is checked on
every access, so one user can never read or continue another user's conversation. A conversation lives
``history_ttl_s`` from its last turn, unless it gives way to the service's history budget before
(``worker.store.history_budget``): then its owner is told so.
"""
from __future__ import annotations

import json
import time
import uuid

import redis

from worker.errors import ConversationCleared, NotYourConversation
from worker.store.keys import ConvField, Keys


class ConversationStore:
    def __init__(self, r: redis.Redis, keys: Keys, ttl_s: int):
        self.r, self.keys, self.ttl_s = r, keys, ttl_s

    @staticmethod
    def new_id() -> str:
        """A fresh conversation id; the conversation exists once a turn in it is admitted."""
        return uuid.uuid4().hex

    def create(self, user: str) -> str:
        conv = self.new_id()
        key = self.keys.conversation(conv)
        with self.r.pipeline() as p:
            p.hset(key, mapping={ConvField.user: user, ConvField.created: time.time()})
            p.expire(key, self.ttl_s)
            p.execute()
        return conv

    def owner(self, conv: str) -> str | None:
        if not isinstance(conv, str) or not conv:
            return None
        owner = self.r.hget(self.keys.conversation(conv), ConvField.user)
        return owner.decode() if owner is not None else None

    def check_owner(self, user: str, conv: str) -> None:
        """Raise NotYourConversation unless ``conv`` exists and belongs to ``user`` (same error either way), or
        ConversationCleared to the owner of one that gave way to the history budget."""
        if self.owner(conv) != user:
            if isinstance(conv, str) and conv and self.r.get(self.keys.cleared(conv)) == user.encode():
                raise ConversationCleared()
            raise NotYourConversation()

    def turns(self, conv: str) -> list[dict]:
        return [json.loads(t) for t in self.r.lrange(self.keys.turns(conv), 0, -1)]

    def refresh(self, conv: str) -> None:
        with self.r.pipeline() as p:
            p.expire(self.keys.conversation(conv), self.ttl_s)
            p.expire(self.keys.turns(conv), self.ttl_s)
            p.execute()


def turn_measure(turn: str | bytes) -> tuple[int, int]:
    """What the history limits count of one stored turn: its text's characters, and 1 if it names a picture (else
    0). The scripts keep a conversation's sums of both (``worker/queue/lua/budgets.lua`` counts the same in Lua)."""
    t = json.loads(turn)
    text = t.get("text")
    return (len(text) if isinstance(text, str) else 0), (1 if isinstance(t.get("image_sha"), str) else 0)


def turn_json(role: str, text: str, image_sha: str | None = None, job_id: str | None = None) -> str:
    """The stored form of one turn."""
    # ensure_ascii=False: UTF-8 as is, since escaping would store an emoji as 12 bytes instead of 4
    return json.dumps({"role": role, "text": text, "image_sha": image_sha, "job_id": job_id}, ensure_ascii=False)
