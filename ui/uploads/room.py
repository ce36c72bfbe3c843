"""Room in the page's upload budget: which stored uploads give way when it is full.

The page's upload budget (``ui.uploads.budget``) bounds what Gradio's upload cache holds on disk. Spent, it kept
everyone's pictures out for two hours (429 "Try again in 115 min"), and a flood could spend it within each
address's own limits: 33 addresses uploading random 10 MB files for 15 s did; so did 40 addresses uploading 10 MB
JPEGs (padding the picture store re-encodes away) and asking a one-token question about each, 436 of them in 55 s.

So each upload is recorded as a claim of its address on the stored file, with its charge, and a turn admitted with the
picture marks the file used. When an upload would not fit, claims are given up to make room for it, each time the oldest
claim of the address holding the most bytes, its unused claims (files only taking room) before its used ones; a file no
address holds a claim on any more is deleted. A used file only showed the picture in the tab: the turn's picture is kept
in the picture store, so the conversation goes on, and a reload shows it again from there
(``ui.uploads.restored_pictures``). Ranking by all an address holds, used or not, is what a flood cannot dodge: marking
its files used (a one-token question each) would otherwise have put every visitor's waiting picture first in line. A
visitor's picture goes only when its address is among the biggest holders left, and what each address spent stays spent
(its own budgets are not given back), so a flood cannot simply start again: only the page's budget gets the bytes back.

Claims are per address. The same file uploaded again by the same address is held once, by its newest upload
(re-uploading one picture had held the budget 25 times over for one file on disk). Uploaded by several addresses
(Gradio names a file by its bytes), it is held by each, gives way as each one's, and is deleted only when the last
claim goes: so uploading someone's picture again neither deletes theirs nor tells, by what happens to the budget or
to one's own files, whether anyone else had uploaded it. A file also owned without a charge (``UploadedPaths``: a
reopened conversation's picture) is never deleted here, and nothing outside the upload folder is ever touched.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, deque

from ui.shared.log_budget import LogBudget
from ui.uploads.budget import Charge, UploadLedger
from ui.uploads.owners import UploadedPaths, path_key

log = LogBudget(logging.getLogger("owlet.ui"), per_minute=2)


class _Holdings:
    """Each address's claims on stored files, unused and used apart, oldest first, and the bytes it holds in all."""

    def __init__(self):
        self.files: dict[str, tuple[OrderedDict[str, int], OrderedDict[str, int]]] = {}  # (unused, used): path -> bytes
        self.bytes: dict[str, int] = {}

    def add(self, address: str, key: str, size: int, used: bool) -> None:
        self.files.setdefault(address, (OrderedDict(), OrderedDict()))[used][key] = size
        self.bytes[address] = self.bytes.get(address, 0) + size

    def mark_used(self, address: str, key: str) -> None:
        unused, used = self.files[address]
        if key in unused:
            used[key] = unused.pop(key)

    def remove(self, address: str, key: str) -> None:
        unused, used = self.files[address]
        self.bytes[address] -= (unused if key in unused else used).pop(key)
        if not unused and not used:
            del self.files[address], self.bytes[address]

    def next_to_go(self) -> tuple[str, str] | None:
        """(address, path): the biggest holder's oldest unused claim, or its oldest used one if it has no unused
        claim left (of equal holders, one with an unused claim)."""
        if not self.bytes:
            return None
        address = max(self.bytes, key=lambda a: (self.bytes[a], bool(self.files[a][0])))
        unused, used = self.files[address]
        return address, next(iter(unused or used))

    def total(self) -> int:
        return sum(self.bytes.values())


class UploadRoom:
    """Each address's claims on stored uploads, used or not, and ``make_room`` (thread-safe)."""

    def __init__(self, ledger: UploadLedger, uploads: UploadedPaths, folder: str, clock=time.monotonic):
        self.ledger, self.uploads, self._clock = ledger, uploads, clock
        self.folder = os.path.realpath(folder)
        self._claims: dict[str, dict[str, Charge]] = {}  # path -> address -> its newest charge for the file
        self._holdings = _Holdings()
        self._in_order: deque[tuple[Charge, str, str]] = deque()  # (charge, address, path), oldest first
        # (address, path) -> when a turn of that address last used the file: per address, so a claim's place in
        # line says nothing about what anyone else did with the same bytes
        self._used_at: OrderedDict[tuple[str, str], float] = OrderedDict()
        self.deleted_files = 0
        self._lock = threading.Lock()

    def claim(self, address: str, path: str, charge: Charge) -> None:
        """An upload from ``address``, charged ``charge``, was stored at ``path``."""
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._forget_old()
            claims = self._claims.setdefault(key, {})
            older = claims.get(address)
            if older is not None:  # the same file again from the same address: held once, by the newest upload
                self.ledger.release(older)
                self._holdings.remove(address, key)
            claims[address] = charge
            self._holdings.add(address, key, charge.held, used=(address, key) in self._used_at)
            self._in_order.append((charge, address, key))

    def mark_used(self, path: str, address: str) -> None:
        """A turn of ``address`` was admitted with the picture at ``path``: the address's claim on it goes after
        its unused ones."""
        key = path_key(path)
        if key is None:
            return
        with self._lock:
            self._used_at[(address, key)] = self._clock()
            self._used_at.move_to_end((address, key))
            if address in self._claims.get(key, {}):
                self._holdings.mark_used(address, key)

    def held_bytes(self, address: str) -> int:
        """Bytes of the stored files ``address`` holds claims on."""
        with self._lock:
            return self._holdings.bytes.get(address, 0)

    def make_room(self, size: int) -> int:
        """Give up claims until ``size`` more bytes fit in the page's budget, if that can get there (else give up
        nothing): each time the oldest claim of the address holding the most, its unused claims before its used
        ones; a file nobody holds a claim on any more is deleted. Returns the bytes freed."""
        with self._lock:
            self._forget_old()
            room = self.ledger.page_room()
            if room >= size or room + self._holdings.total() < size:
                return 0
            doomed, freed, addresses = [], 0, set()
            while room + freed < size and (choice := self._holdings.next_to_go()) is not None:
                address, key = choice
                self._holdings.remove(address, key)
                freed += self.ledger.release(self._claims[key].pop(address))
                self.uploads.forget(address, key)  # neither served to it nor nameable in its chats any more
                addresses.add(address)
                if not self._claims[key]:
                    del self._claims[key]
                    if not self.uploads.owners(key):  # nor owned without a charge (a reopened chat's picture)
                        doomed.append(key)
        deleted = sum(self._delete(key) for key in doomed)
        with self._lock:
            self.deleted_files += deleted
        log.warning("upload budget full: gave up %.1f MB of uploads of %d addresses (%d files deleted) to make room",
                    freed / 2**20, len(addresses), deleted)
        return freed

    def _forget_old(self) -> None:
        """A claim whose charge has left the page's window holds nothing of its budget (its file is past the
        cache's age); uses older than the window are of files the cleaner has deleted."""
        self.ledger.page_room()  # moves the window
        while self._in_order and not self._in_order[0][0].in_page_window:
            charge, address, key = self._in_order.popleft()
            claims = self._claims.get(key, {})
            if claims.get(address) is not charge:
                continue  # uploaded again since, or given up
            del claims[address]
            self._holdings.remove(address, key)
            if not claims:
                del self._claims[key]
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
