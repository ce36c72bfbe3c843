"""What the page's image checks decided, remembered, so the same file is decoded once.

A client can name one uploaded file in any number of questions (and upload the same bytes under other names), and a
refused turn costs no quota or rate: without a verdict, each would decode the file again, up to a second of CPU for
a small file of many pixels (enough to keep the decode pool busy). A verdict, the checked image or the sentence that
refused it, is kept by the file's content (its SHA-256, with the limits it was checked under and the client's
address), and found again by path, size and modification time without reading the file. Per address, because a
verdict shared by everyone answers at once for bytes someone else sent: a stranger timing a check would learn that
someone uploaded that picture (0.32 s against 0.95 s). Kept images are bounded in bytes, refusals
in number, and both in number too (``MAX_ENTRIES``). The least recently used go first.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import OrderedDict

# Verdicts (kept images and refusals together) and file names remembered: a verdict saves a decode when the same
# bytes come back soon (a refused turn sent again, a file named in many questions), so the most recent ones are what
# count. Each costs about 0.75 KB beyond its image's bytes (tracemalloc): small pictures never reach the byte bound,
# so the page's memory grows with each new one up to this count (4096 would be 15 MB of 3 KB pictures, more than 40
# minutes of bench/soak.py's traffic).
MAX_ENTRIES = 1024


def file_key(path: str, scope) -> tuple | None:
    """A file as the page names it: path, size and modification time (Gradio names an upload by its content), under
    ``scope`` (the limits and the client's address)."""
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return path, stat.st_size, stat.st_mtime_ns, scope


def content_key(data: bytes, scope) -> tuple:
    return hashlib.sha256(data).digest(), scope


class DecodeVerdicts:
    """Thread-safe: the decode pool's threads record, the event loop looks up."""

    def __init__(self, max_image_bytes: int = 64 << 20, max_entries: int = MAX_ENTRIES):
        self.max_image_bytes, self.max_entries = max_image_bytes, max_entries
        self._by_content: OrderedDict[tuple, object] = OrderedDict()  # content key -> CheckedImage or refusal text
        self._by_file: OrderedDict[tuple, tuple] = OrderedDict()  # file key -> content key
        self._image_bytes = 0
        self._lock = threading.Lock()

    def by_file(self, key: tuple | None):
        """The verdict on the file at ``key`` (see ``file_key``), or None."""
        with self._lock:
            content = self._by_file.get(key) if key else None
            return self._get(content) if content else None

    def by_content(self, key: tuple):
        with self._lock:
            return self._get(key)

    def record(self, file: tuple | None, content: tuple, verdict) -> None:
        """Remember ``verdict`` (a CheckedImage, or the refusal's sentence) for these bytes, and this file."""
        size = len(verdict.data) if hasattr(verdict, "data") else 0
        if size > self.max_image_bytes:
            return
        with self._lock:
            if content not in self._by_content:
                self._by_content[content] = verdict
                self._image_bytes += size
            self._by_content.move_to_end(content)
            if file:
                self._by_file[file] = content
                self._by_file.move_to_end(file)
            while self._image_bytes > self.max_image_bytes or len(self._by_content) > self.max_entries:
                _, dropped = self._by_content.popitem(last=False)
                self._image_bytes -= len(dropped.data) if hasattr(dropped, "data") else 0
            while len(self._by_file) > self.max_entries:
                self._by_file.popitem(last=False)

    def _get(self, content: tuple | None):
        verdict = self._by_content.get(content) if content else None
        if verdict is not None:
            self._by_content.move_to_end(content)
        return verdict
