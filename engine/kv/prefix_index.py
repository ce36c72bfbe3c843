"""PrefixIndex: prompt prefixes shared across conversations, found by content, never by conversation id.

A new conversation whose prompt starts like one the engine already computed (the same example picture and
question; the same system prompt and picture) restores that prefix and prefills only the rest. What identifies a
prefix is its token ids plus the content hash of every image that starts inside it: image tokens are the same id
for every picture, so token ids alone would match two different pictures.

Share points. A prompt offers a few lengths others may share (``share_points``): the end of its last image (the
system prompt and the picture; questions differ after it) and its length minus one (the whole prompt: the engine
must still run one token to get the first answer token's logits). The template head keeps its own entry
(engine/kv/session_store.py). When a prompt's prefill reaches its last share point (full attention: when it ends) and
nobody holds that yet, the session store keeps one entry covering it, under ``entry_key``; every share point of
that prompt is an alias (``content_key``) of that entry.

Exactness, as the session cache's rules:
- full-attention layers: K/V of a prefix is a slice, so one entry serves every shorter share point, and the
  token-by-token match may run past a share point (a common start of two questions) up to the next image;
- conv layers (LFM2) and sliding-window layers (Gemma 3, Mistral) are valid only at the exact length they were
  taken: for those models a first prompt's prefill pauses at its share points (``chunk_stop``; the engine runs the
  pieces in the same step) and the entry keeps a checkpoint at each; a restore takes only a checkpointed length.
  A batched prefill's rows do not pause, so such a row keeps nothing;
- M-RoPE positions depend only on token ids and images, so a prefix with equal ids and images has equal positions;
- mPLUG-Owl3's images are cross-attended by the tokens after them: the prefix's self-attention K/V depends on the
  pictures before its end, which the key includes; the request's own images are encoded (or found in the feature
  cache) as for any new prompt.
A prompt whose image tokens cannot be matched to its images gets no key: it is never shared.

Memory: an entry is charged to the group whose prompt made it (it counts in that group's ``group_share``), so one
client opening conversation after conversation evicts its own oldest prefixes first and cannot flush others'. The
first hit from a different group makes it shared (group None): no group's share counts it any more and it is
evicted by the pool's LRU like the template head, so nobody can pin a prefix by using it.
"""
from __future__ import annotations

import hashlib
import weakref

_ENTRY = "prefix:shared:"


def image_spans(prompt, image_token_id: int | None) -> list[tuple[int, int, str]] | None:
    """(first image token, last + 1, content hash) per image of ``prompt``; None when they cannot be placed."""
    if image_token_id is None:
        return None
    slots = [i for i, t in enumerate(prompt.token_ids) if t == image_token_id]
    if len(slots) != sum(img.num_image_tokens for img in prompt.images):
        return None
    spans, start = [], 0
    for img in prompt.images:
        if img.num_image_tokens == 0:
            return None
        run = slots[start:start + img.num_image_tokens]
        spans.append((run[0], run[-1] + 1, img.sha256))
        start += img.num_image_tokens
    return spans


def share_points(prompt, spans) -> list[int]:
    """Lengths of ``prompt`` another conversation may share, ascending: the end of its last image, and its length
    minus one. Only lengths past the template head (cached on its own)."""
    if spans is None:
        return []
    top = len(prompt.token_ids) - 1
    head = len(prompt.head_ids or ())
    points = {top} | ({spans[-1][1]} if spans else set())
    return sorted(n for n in points if head < n <= top)


def content_key(prompt, n: int, spans) -> str:
    """What the first ``n`` tokens of ``prompt`` are: their ids and the hashes of the images starting before n."""
    digest = hashlib.sha256(str(prompt.token_ids[:n]).encode())
    for start, _, sha in spans:
        if start < n:
            digest.update(f"|{start}:{sha}".encode())
    return digest.hexdigest()[:32]


class PrefixIndex:
    """Aliases (content key of a share point -> session store key of the entry covering it), and the exact-length
    states a first prompt's chunks left at its share points, kept until its entry is made."""

    def __init__(self, image_token_id: int | None, exact_lengths: bool):
        self.image_token_id = image_token_id  # None: the runner did not say which token is an image; never share
        self.exact_lengths = exact_lengths  # conv or sliding-window layers: only checkpointed lengths restore
        self.aliases: dict[str, str] = {}
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # request -> {length: states}
        self._points: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # request -> (spans, points, keys)

    def plan(self, req):
        """(spans, share points, their content keys) of ``req``'s prompt, computed once per request."""
        got = self._points.get(req)
        if got is None:
            spans = image_spans(req.prompt, self.image_token_id)
            points = share_points(req.prompt, spans)
            got = (spans, points, [content_key(req.prompt, n, spans) for n in points])
            self._points[req] = got
        return got

    def lookup(self, entries, req):
        """The longest shared prefix of ``req``'s prompt: (entry, tokens usable) or (None, 0)."""
        spans, points, keys = self.plan(req)
        ids = req.prompt.token_ids
        for n, key in sorted(zip(points, keys), reverse=True):
            entry_key = self.aliases.get(key)
            entry = entries.get(entry_key) if entry_key is not None else None
            if entry is None:
                self.aliases.pop(key, None)
                continue
            usable = entry.usable_prefix(ids)
            # Past the share point tokens may match further, but not into an image whose content was not compared.
            later_images = [start for start, _, _ in spans if start >= n]
            usable = min(usable, later_images[0]) if later_images else usable
            if usable >= n:
                return entry, usable
        return None, 0

    def held(self, entries, key: str) -> bool:
        entry_key = self.aliases.get(key)
        return entry_key is not None and entry_key in entries

    def chunk_stop(self, entries, req) -> int | None:
        """On exact-length models, the next share point of ``req`` nobody holds: its prefill pauses there for the
        states valid only at that length. None on full-attention models (a slice of the prompt's K/V serves)."""
        if not self.exact_lengths or req.cache_source == "session":
            return None
        _, points, keys = self.plan(req)
        wanted = [n for n, key in zip(points, keys) if n > req.num_computed and not self.held(entries, key)]
        return wanted[0] if wanted else None

    def remember_states(self, req, states: dict) -> None:
        """Exact-length states (``kv_cache.exact_states``) taken at the share point ``req`` just reached."""
        self._states.setdefault(req, {})[req.num_computed] = states

    def states(self, req) -> dict:
        return self._states.pop(req, {})

    def register(self, entries, entry_key: str, keys: list[str]) -> None:
        """Point every share point's key that no live entry holds at ``entry_key``."""
        for key in keys:
            if not self.held(entries, key):
                self.aliases[key] = entry_key

    def prune(self, entries) -> None:
        """Forget aliases of evicted entries (they are also dropped lazily, when a lookup meets one)."""
        if len(self.aliases) > 4 * max(len(entries), 16):
            self.aliases = {k: v for k, v in self.aliases.items() if v in entries}

    @staticmethod
    def entry_key(content: str) -> str:
        return _ENTRY + content
