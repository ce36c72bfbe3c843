"""Incremental detokenisation with stop strings.

Two hazards are handled here, and only here:
- a multi-byte character split across tokens decodes to U+FFFD until its last byte arrives, so text ending in
  U+FFFD is held back;
- a stop string may arrive over several tokens, so the longest tail of the text that could still begin a stop
  string is held back until it is ruled out. The stop string itself is never emitted.
"""
from __future__ import annotations


class IncrementalDetokenizer:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self._tokenizer = tokenizer
        self._stop = stop
        self._ids: list[int] = []
        self._prefix_offset = 0  # decode window start: a few tokens of context keep spacing right
        self._read_offset = 0  # tokens already turned into text
        self.text = ""  # all decoded text so far (stop string cut off once matched)
        self._emitted = 0  # characters of self.text already handed out
        self.stopped = False

    def add_token(self, token_id: int) -> str:
        """Feed one token; return the text that is now safe to emit (maybe empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        decode = self._tokenizer.decode
        prefix = decode(self._ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        full = decode(self._ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release()

    def _release(self) -> str:
        if self._stop:
            # Search only where a new match could start: a stop string can't end inside emitted text.
            start = max(0, self._emitted - max(len(s) for s in self._stop))
            hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
            if hits:
                self.text = self.text[:min(hits)]
                self.stopped = True
                return self._take(len(self.text))
        return self._take(len(self.text) - self._holdback())

    def _holdback(self) -> int:
        """Length of the longest text tail that is a proper prefix of some stop string."""
        best = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(self.text)), best, -1):
                if self.text.endswith(s[:k]):
                    best = k
                    break
        return best

    def _take(self, upto: int) -> str:
        if upto <= self._emitted:
            return ""
        delta = self.text[self._emitted:upto]
        self._emitted = upto
        return delta

    def flush(self) -> str:
        """At the end of the request: release held-back text (it did not become a stop string)."""
        if self.stopped:
            return ""
        return self._take(len(self.text))
