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

The same bytes uploaded from two addresses are one file: it is deleted only when no address owns it any more
(``UploadedPaths``); a file written for a reopened conversation (``ui.restored_pictures``) is owned without a
charge, so it is never deleted here. Nothing is deleted unless deleting can make the upload fit, and nothing
outside the upload folder is ever touched.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque

from ui.log_budget import LogBudget
from ui.upload_budget import Charge, UploadLedger
from ui.upload_owners import UploadedPaths, path_key

log = LogBudget(logging.getLogger("owlet.ui"), per_minute=2)


class UnusedUploads:
    """Unused uploads by address, and ``make_room`` (thread-safe)."""

    def __init__(self, ledger: UploadLedger, uploads: UploadedPaths, folder: str, clock=time.monotonic):
        self.ledger, self.uploads, self._clock = ledger, uploads, clock
        self.folder = os.path.realpath(folder)
        # path -> address -> its charges for the file, each with the bytes it was counted at here
        self._claims: dict[str, dict[str, list[tuple[Charge, int]]]] = {}
        self._of_address: dict[str, OrderedDict[str, int]] = {}  # address -> its unused paths (oldest first) -> bytes
        self._bytes: dict[str, int] = {}  # address -> unused bytes it holds
        self._in_order: deque[tuple[Charge, str, str]] = deque()  # (charge, address, path), oldest first
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
            if key in self._used:  # the same bytes again: the file is shown in a chat already
                return
            self._claims.setdefault(key, {}).setdefault(address, []).append((charge, charge.held))
            paths = self._of_address.setdefault(address, OrderedDict())
            paths[key] = paths.get(key, 0) + charge.held
            self._bytes[address] = self._bytes.get(address, 0) + charge.held
            self._in_order.append((charge, address, key))

    def mark_used(self, path: str) -> None:
        """A turn was admitted with the picture at ``path``: the file is never deleted here."""
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._used[key] = self._clock()
            self._used.move_to_end(key)
            for address in self._claims.pop(key, {}):
                self._drop(address, key)

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
                for charge, _counted in self._claims[key].pop(address):
                    freed += self.ledger.release(charge)
                if not self._claims[key]:
                    del self._claims[key]
                self._drop(address, key)
                self.uploads.forget(address, key)  # neither served to it nor nameable in its chat any more
                addresses.add(address)
                if key not in self._claims and not self.uploads.owners(key):
                    doomed.append(key)
            self.freed_bytes += freed
        deleted = sum(self._delete(key) for key in doomed)
        with self._lock:
            self.deleted_files += deleted
        log.warning("upload budget full: deleted %d unused uploads (%.1f MB) of %d addresses to make room",
                    deleted, freed / 2**20, len(addresses))
        return freed

    def _drop(self, address: str, key: str) -> None:
        """Take ``key`` out of ``address``'s unused paths (its claims are gone already)."""
        paths = self._of_address[address]
        self._bytes[address] -= paths.pop(key)
        if not paths:
            del self._of_address[address], self._bytes[address]

    def _forget_old(self) -> None:
        """Charges that have left the page's window hold nothing of its budget (their files are past the cache's
        age too), and uses older than the window are of files the cleaner has deleted."""
        self.ledger.page_room()  # moves the window
        while self._in_order and not self._in_order[0][0].in_page_window:
            charge, address, key = self._in_order.popleft()
            charges = self._claims.get(key, {}).get(address, [])
            counted = next((n for c, n in charges if c is charge), None)
            if counted is None:
                continue  # used or deleted since
            charges[:] = [(c, n) for c, n in charges if c is not charge]
            self._of_address[address][key] -= counted
            self._bytes[address] -= counted
            if not charges:
                del self._claims[key][address]
                if not self._claims[key]:
                    del self._claims[key]
                self._drop(address, key)
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
