"""Room in the page's upload budget: which stored uploads give way when it is full.

The page's upload budget (``ui.upload_budget``) bounds what Gradio's upload cache holds on disk. Spent, it kept
everyone's pictures out for two hours (429 "Try again in 115 min"), and two hostile audits (2026-12-03) spent it
within each address's own limits: 33 addresses uploading random 10 MB files for 15 s; then 40 addresses uploading
10 MB JPEGs (padding the picture store re-encodes away) and asking a one-token question about each, 436 of them in
55 s.

So each stored upload is recorded with its charge and the address it counts for (its first uploader), and a turn
admitted with the picture marks it used. When an upload would not fit, stored files are deleted to make room for it,
each time the oldest file of the address holding the most bytes: its unused files (only taking room) before its
used ones. A used file only showed the picture in the tab: the turn's picture is kept in the picture store, so the
conversation goes on, and a reload shows it again from there (``ui.restored_pictures``). Ranking by all an address
holds, used or not, is what a flood cannot dodge: marking its files used (a one-token question each) would
otherwise have put every visitor's waiting picture first in line. A visitor's picture goes only when its address is
among the biggest holders left, and what each address spent stays spent (its own budgets are not given back), so a
flood cannot simply start again: only the page's budget gets the bytes back, because the disk has.

The same bytes uploaded again, from any address, are the same file (Gradio names it by its bytes): it holds the
page's budget once, through its newest upload (re-uploading one picture held the budget 25 times over for one file
on disk), counts for the address that uploaded it first, and when it is deleted every address that uploaded it
loses it. A file also owned without a charge (``UploadedPaths``: a reopened conversation's picture) is never
deleted here. Nothing is deleted unless deleting can make the upload fit, and nothing outside the upload folder is
ever touched.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass

from ui.log_budget import LogBudget
from ui.upload_budget import Charge, UploadLedger
from ui.upload_owners import UploadedPaths, path_key

log = LogBudget(logging.getLogger("owlet.ui"), per_minute=2)


@dataclass
class _Stored:
    """One stored file: the address it counts for (its first uploader), every address that uploaded it, its bytes,
    and whether an admitted turn has used it."""
    address: str
    uploaders: set[str]
    size: int
    used: bool = False


class _Holdings:
    """Stored files by the address they count for: each address's unused and used files, oldest first, and the
    bytes it holds in all."""

    def __init__(self):
        self.files: dict[str, tuple[OrderedDict[str, None], OrderedDict[str, None]]] = {}  # (unused, used)
        self.bytes: dict[str, int] = {}

    def add(self, address: str, key: str, size: int, used: bool) -> None:
        self.files.setdefault(address, (OrderedDict(), OrderedDict()))[used][key] = None
        self.bytes[address] = self.bytes.get(address, 0) + size

    def resize(self, address: str, change: int) -> None:
        self.bytes[address] += change

    def mark_used(self, address: str, key: str) -> None:
        unused, used = self.files[address]
        del unused[key]
        used[key] = None

    def remove(self, address: str, key: str, size: int, used: bool) -> None:
        del self.files[address][used][key]
        self.bytes[address] -= size
        if not any(self.files[address]):
            del self.files[address], self.bytes[address]

    def next_to_go(self) -> str | None:
        """The biggest holder's oldest unused file, or its oldest used one if it has no unused file left (of equal
        holders, one with an unused file)."""
        if not self.bytes:
            return None
        unused, used = self.files[max(self.bytes, key=lambda a: (self.bytes[a], bool(self.files[a][0])))]
        return next(iter(unused or used))

    def total(self) -> int:
        return sum(self.bytes.values())


class UploadRoom:
    """Stored uploads by address, used or not, and ``make_room`` (thread-safe)."""

    def __init__(self, ledger: UploadLedger, uploads: UploadedPaths, folder: str, clock=time.monotonic):
        self.ledger, self.uploads, self._clock = ledger, uploads, clock
        self.folder = os.path.realpath(folder)
        self._holder: dict[str, Charge] = {}  # each stored file's newest upload: it alone holds the file's bytes
        self._stored: dict[str, _Stored] = {}
        self._holdings = _Holdings()
        self._in_order: deque[tuple[Charge, str]] = deque()  # (charge, path) of every stored upload, oldest first
        self._used_at: OrderedDict[str, float] = OrderedDict()  # path -> when a turn last used it
        self.deleted_files = self.freed_bytes = 0
        self._lock = threading.Lock()

    def claim(self, address: str, path: str, charge: Charge) -> None:
        """An upload from ``address``, charged ``charge``, was stored at ``path``."""
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._forget_old()
            older = self._holder.get(key)
            if older is not None and older is not charge:
                self.ledger.release(older)  # one file on disk, held once: by its newest upload
            self._holder[key] = charge
            self._in_order.append((charge, key))
            stored = self._stored.get(key)
            if stored is None:
                stored = self._stored[key] = _Stored(address, {address}, charge.held, used=key in self._used_at)
                self._holdings.add(address, key, stored.size, stored.used)
            else:
                stored.uploaders.add(address)
                self._holdings.resize(stored.address, charge.held - stored.size)
                stored.size = charge.held

    def mark_used(self, path: str) -> None:
        """A turn was admitted with the picture at ``path``: it goes only after every unused file."""
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._used_at[key] = self._clock()
            self._used_at.move_to_end(key)
            stored = self._stored.get(key)
            if stored is not None and not stored.used:
                self._holdings.mark_used(stored.address, key)
                stored.used = True

    def held_bytes(self, address: str) -> int:
        """Bytes of the stored files that count for ``address``."""
        with self._lock:
            return self._holdings.bytes.get(address, 0)

    def make_room(self, size: int) -> int:
        """Delete stored uploads until ``size`` more bytes fit in the page's budget, if deleting can get there
        (else delete nothing): each time the oldest file of the address holding the most, its unused files before
        its used ones. Returns the bytes freed."""
        with self._lock:
            self._forget_old()
            room = self.ledger.page_room()
            if room >= size or room + self._holdings.total() < size:
                return 0
            doomed, freed, addresses = [], 0, set()
            while room + freed < size and (key := self._holdings.next_to_go()) is not None:
                stored = self._stored.pop(key)
                self._holdings.remove(stored.address, key, stored.size, stored.used)
                for uploader in stored.uploaders:  # neither served to them nor nameable in their chats any more
                    self.uploads.forget(uploader, key)
                addresses.update(stored.uploaders)
                if self.uploads.owners(key):
                    continue  # also held without a charge (not an upload of this page's): the file stays
                freed += self.ledger.release(self._holder.pop(key))
                doomed.append(key)
            self.freed_bytes += freed
        deleted = sum(self._delete(key) for key in doomed)
        with self._lock:
            self.deleted_files += deleted
        log.warning("upload budget full: deleted %d uploads (%.1f MB) of %d addresses to make room",
                    deleted, freed / 2**20, len(addresses))
        return freed

    def _forget_old(self) -> None:
        """A file whose newest upload has left the page's window holds nothing of its budget (and is past the
        cache's age); uses older than the window are of files the cleaner has deleted."""
        self.ledger.page_room()  # moves the window
        while self._in_order and not self._in_order[0][0].in_page_window:
            charge, key = self._in_order.popleft()
            if self._holder.get(key) is not charge:
                continue  # uploaded again since, or deleted
            del self._holder[key]
            stored = self._stored.pop(key, None)  # None: given up by its uploaders, kept for another owner
            if stored is not None:
                self._holdings.remove(stored.address, key, stored.size, stored.used)
        horizon = self._clock() - self.ledger.total_window_s
        while self._used_at and next(iter(self._used_at.values())) < horizon:
            self._used_at.popitem(last=False)

    def _delete(self, key: str) -> int:
        if os.path.commonpath([key, self.folder]) != self.folder:
            return 0  # an upload answer names a file in the upload folder; anything else is left alone
        try:
            os.unlink(key)
            return 1
        except FileNotFoundError:  # the cache cleaner came first
            return 0
        except OSError:
            logging.getLogger("owlet.ui").warning("could not delete a stored upload", exc_info=True)
            return 0
