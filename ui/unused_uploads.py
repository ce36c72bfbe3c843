"""Uploads no chat turn has used, and taking their room back when the page's upload budget is full.

The page's upload budget (``ui.upload_budget``) bounds what Gradio's upload cache holds on disk. Spent on files
nobody ever asks about, it kept everyone's pictures out: in a hostile audit (2026-12-03) 33 addresses, each within
its own limits, uploaded random 10 MB files for 15 s, and for the next two hours every upload over about 3 MB got
429 "Try again in 115 min".

A file that no admitted turn has named is only taking room. So each upload's path is recorded with its charge and
its address, and a turn admitted with the picture marks the file used (it is shown in a chat from then on, and
stays until Gradio's cache cleaner deletes it). When an upload would not fit in the page's budget, unused uploads
are deleted to make room: from the address holding the most unused bytes first, each address's oldest first. A
flood deletes itself, and a visitor's one picture, uploaded and waiting for its question, goes only when its
address is among the biggest holders left. What each address spent stays spent (its own budgets are not given
back), so a flood cannot simply start again; only the page's budget gets the bytes back, because the disk has.

The same bytes uploaded again, from any address, are the same file (Gradio names it by its bytes): it holds the
page's budget once, through its newest upload; it counts for the address that uploaded it first, and when it is
deleted, every address that uploaded it loses it. A file also owned without a charge (``UploadedPaths``: a
reopened conversation's picture, ``ui.restored_pictures``) is never deleted here. Nothing is deleted unless
deleting can make the upload fit, and nothing outside the upload folder is ever touched.
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
class _Unused:
    """A stored file no turn has used: the address it counts for (its first uploader), every address that uploaded
    it, and its bytes."""
    address: str
    uploaders: set[str]
    size: int


class UnusedUploads:
    """Stored uploads, the unused ones by address, and ``make_room`` (thread-safe)."""

    def __init__(self, ledger: UploadLedger, uploads: UploadedPaths, folder: str, clock=time.monotonic):
        self.ledger, self.uploads, self._clock = ledger, uploads, clock
        self.folder = os.path.realpath(folder)
        # Each stored file's newest upload: the one charge that holds its bytes in the page's budget. The same
        # bytes uploaded again are the same file, so the older charge gives its bytes back (else re-uploading one
        # picture, used once, held the budget many times over for one file on disk: a hostile audit, 2026-12-03).
        self._holder: dict[str, Charge] = {}
        self._unused: dict[str, _Unused] = {}
        self._of_address: dict[str, OrderedDict[str, None]] = {}  # address -> the unused files it counts for, oldest first
        self._bytes: dict[str, int] = {}  # address -> bytes of the unused files it counts for
        self._in_order: deque[tuple[Charge, str]] = deque()  # (charge, path) of every stored upload, oldest first
        self._used: OrderedDict[str, float] = OrderedDict()  # path -> when a turn last used it
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
            if key in self._used:  # shown in a chat already
                return
            entry = self._unused.get(key)
            if entry is None:
                self._unused[key] = _Unused(address, {address}, charge.held)
                self._of_address.setdefault(address, OrderedDict())[key] = None
                self._bytes[address] = self._bytes.get(address, 0) + charge.held
            else:
                entry.uploaders.add(address)
                self._bytes[entry.address] += charge.held - entry.size
                entry.size = charge.held

    def mark_used(self, path: str) -> None:
        """A turn was admitted with the picture at ``path``: the file is never deleted here."""
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._used[key] = self._clock()
            self._used.move_to_end(key)
            entry = self._unused.pop(key, None)
            if entry is not None:
                self._unindex(entry, key)

    def unused_bytes(self, address: str) -> int:
        with self._lock:
            return self._bytes.get(address, 0)

    def make_room(self, size: int) -> int:
        """Delete unused uploads until ``size`` more bytes fit in the page's budget, if deleting can get there
        (else delete nothing). Returns the bytes freed."""
        with self._lock:
            self._forget_old()
            room = self.ledger.page_room()
            if room >= size or room + sum(self._bytes.values()) < size:
                return 0
            doomed, freed, addresses = [], 0, set()
            while room + freed < size and self._bytes:
                address = max(self._bytes, key=self._bytes.__getitem__)
                key = next(iter(self._of_address[address]))
                entry = self._unused.pop(key)
                self._unindex(entry, key)
                for uploader in entry.uploaders:  # neither served to them nor nameable in their chats any more
                    self.uploads.forget(uploader, key)
                addresses.update(entry.uploaders)
                if self.uploads.owners(key):
                    continue  # also held without a charge (not an upload of this page's): the file stays
                freed += self.ledger.release(self._holder.pop(key))
                doomed.append(key)
            self.freed_bytes += freed
        deleted = sum(self._delete(key) for key in doomed)
        with self._lock:
            self.deleted_files += deleted
        log.warning("upload budget full: deleted %d unused uploads (%.1f MB) of %d addresses to make room",
                    deleted, freed / 2**20, len(addresses))
        return freed

    def _unindex(self, entry: _Unused, key: str) -> None:
        """Take the unused file ``key`` out of its address's index."""
        paths = self._of_address[entry.address]
        del paths[key]
        self._bytes[entry.address] -= entry.size
        if not paths:
            del self._of_address[entry.address], self._bytes[entry.address]

    def _forget_old(self) -> None:
        """A file whose newest upload has left the page's window holds nothing of its budget (and is past the
        cache's age); uses older than the window are of files the cleaner has deleted."""
        self.ledger.page_room()  # moves the window
        while self._in_order and not self._in_order[0][0].in_page_window:
            charge, key = self._in_order.popleft()
            if self._holder.get(key) is not charge:
                continue  # uploaded again since, or deleted
            del self._holder[key]
            entry = self._unused.pop(key, None)
            if entry is not None:
                self._unindex(entry, key)
        horizon = self._clock() - self.ledger.total_window_s
        while self._used and next(iter(self._used.values())) < horizon:
            self._used.popitem(last=False)

    def _delete(self, key: str) -> int:
        if os.path.commonpath([key, self.folder]) != self.folder:
            return 0  # an upload answer names a file in the upload folder; anything else is left alone
        try:
            os.unlink(key)
            return 1
        except FileNotFoundError:  # the cache cleaner came first
            return 0
        except OSError:
            logging.getLogger("owlet.ui").warning("could not delete an unused upload", exc_info=True)
            return 0
