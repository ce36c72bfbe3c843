"""DiskTier: session-cache entries kept as files in a worker-local folder, so they outlive host memory and the
worker itself.

Every entry the session store keeps is also written here (write-through, by one background thread, the newest
version of a key replacing any still waiting), stored as the store stores it in host memory (int8/int4 K/V with
``park_mode``, full-precision conv states). Entries then survive both their eviction from memory and a crash or
restart of the worker: a worker started again on the same folder indexes the files it finds and serves the
conversations' follow-ups from them.

- **Bounded**: the files never hold more than ``budget_bytes`` in all, temporary files included; the least
  recently used file goes first. An entry larger than the whole budget is not written.
- **Safe**: files are written to a temporary name and renamed (``engine.kv.entry_file``); a file that fails any check
  on reading (torn, truncated, corrupt, another model, dtype, layout or key) is deleted and the lookup is a miss,
  so the turn is recomputed, which gives the same tokens.
- **Only where faster**: reads are timed (bytes per second) and so are prefills (tokens per second, from finished
  turns); a file whose read would take longer than prefilling its tokens is not read.
- **One worker per folder**: an exclusive ``flock`` on ``owlet.lock`` is held for the tier's lifetime (the kernel
  releases it when the process dies, however it dies); a second worker on the same folder is refused with
  :class:`FolderInUse`.

What it does not know: caches, requests, Redis. The session store decides what to keep and calls ``put``/``get``.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from . import entry_file
from .entry_file import BadEntryFile, Identity

log = logging.getLogger("owlet.engine")

LOCK_NAME = "owlet.lock"
SUFFIX = ".kv"
_FINGERPRINT_BYTES = 1 << 20  # of each weight file, with its size: tells checkpoints apart without hashing them
_EWMA = 0.3  # weight of the newest measurement in the read and prefill speed estimates
_MIN_PREFILL_TOKENS = 32  # shorter prefills measure per-call overhead, not the speed a file read competes with
# Entries waiting for the writer at most: beyond, the oldest waiting is not written (the store may have evicted it
# already, and the writer must not hold more than this many entries in host memory behind a slow disk).
MAX_PENDING = 64


class FolderInUse(RuntimeError):
    """Another process holds this disk-cache folder: two workers never share one."""


@dataclass
class _File:
    nbytes: int
    tokens: int  # tokens the entry covers (what a read saves prefilling)


def open_for(config, runner) -> "DiskTier | None":
    """The disk tier an engine with ``config`` uses (``EngineConfig.disk_cache_dir``), or None without one.
    Raises FolderInUse when another worker holds the folder."""
    if not config.disk_cache_dir:
        return None
    layout = f"{config.park_mode}/{config.park_group_size}/f{entry_file.FORMAT}"
    identity = Identity(model_fingerprint(config.model), str(runner.dtype).removeprefix("torch."), layout)
    return DiskTier(config.disk_cache_dir, int(config.disk_cache_mb * 2**20), identity)


def model_fingerprint(model: str) -> str:
    """A short digest naming a checkpoint: its config and, per weight file, its name, size and first MiB."""
    folder = Path(model)
    h = hashlib.sha256()
    if not folder.is_dir():
        h.update(model.encode())
        return h.hexdigest()[:24]
    for path in sorted(folder.iterdir()):
        if path.name == "config.json" or path.suffix in (".safetensors", ".bin", ".pt"):
            h.update(path.name.encode())
            h.update(str(path.stat().st_size).encode())
            with open(path, "rb") as f:
                h.update(f.read(_FINGERPRINT_BYTES if path.suffix != ".json" else -1))
    return h.hexdigest()[:24]


class DiskTier:
    def __init__(self, folder: str | os.PathLike, budget_bytes: int, identity: Identity):
        self.folder = Path(folder).expanduser()  # "~/cache", as a .env file leaves it: not a folder named "~"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock_file = _take_folder(self.folder)
        self.budget = int(budget_bytes)
        self.identity = identity
        self._files: OrderedDict[str, _File] = OrderedDict()  # key -> file, least recently used first
        self._lock = threading.Lock()
        self._pending: dict[str, object] = {}  # key -> entry waiting to be written (the newest version only)
        self._wake = threading.Condition(self._lock)
        self._writing: str | None = None
        self._closed = False
        self.read_bytes_per_s: float | None = None
        self.prefill_tokens_per_s: float | None = None
        self.counters = dict(disk_hits=0, disk_misses=0, disk_dropped=0, disk_writes=0, disk_write_errors=0,
                             disk_evictions=0, disk_too_large=0, disk_write_skipped=0, disk_skipped_slower=0,
                             disk_reopened=0)
        self._index()
        self._writer = threading.Thread(target=self._write_loop, name="owlet-disk-tier", daemon=True)
        self._writer.start()

    # -- the store's calls --------------------------------------------------------------------------------
    def put(self, key: str, entry) -> None:
        """Write ``entry`` under ``key`` soon (in the background), replacing the key's file."""
        with self._lock:
            if self._closed:
                return
            self._pending.pop(key, None)  # the newest version goes to the back of the line
            self._pending[key] = entry
            while len(self._pending) > MAX_PENDING:
                self._pending.pop(next(iter(self._pending)))
                self.counters["disk_write_skipped"] += 1
            self._wake.notify()

    def get(self, key: str) -> dict | None:
        """The entry's fields (``entry_file.read``) if a trusted file holds ``key`` and reading it is expected to be
        faster than prefilling its tokens; else None."""
        with self._lock:
            waiting = self._pending.get(key)
            info = self._files.get(key)
        if waiting is not None:  # not on disk yet: the entry itself is at hand
            self.counters["disk_hits"] += 1
            return dict(token_ids=waiting.token_ids, kv=waiting.kv, conv_checkpoints=waiting.conv_checkpoints,
                        hybrid=waiting.hybrid, group=waiting.group)
        if info is None:
            self.counters["disk_misses"] += 1
            return None
        if not self.worth_reading(info.nbytes, info.tokens):
            self.counters["disk_skipped_slower"] += 1
            return None
        path = self._path(key)
        start = time.perf_counter()
        try:
            fields = entry_file.read(str(path), key, self.identity)
        except (BadEntryFile, OSError) as exc:
            log.warning("dropping disk-cache file %s (%s): that turn is recomputed", path.name, exc)
            self.counters["disk_dropped"] += 1
            self._forget(key, unlink=True)
            return None
        self._note_read(info.nbytes, time.perf_counter() - start)
        with self._lock:
            if key in self._files:
                self._files.move_to_end(key)
        with contextlib.suppress(OSError):
            os.utime(path)  # recency survives a restart: the index is ordered by modification time
        self.counters["disk_hits"] += 1
        return fields

    def worth_reading(self, nbytes: int, tokens: int) -> bool:
        """Reading ``nbytes`` is expected to take less time than prefilling ``tokens`` (True until both are
        measured)."""
        if not self.read_bytes_per_s or not self.prefill_tokens_per_s:
            return True
        return nbytes / self.read_bytes_per_s < tokens / self.prefill_tokens_per_s

    def note_prefill(self, tokens: int, seconds: float) -> None:
        """A prefill of ``tokens`` took ``seconds``: the speed a file read competes with. Measured from a turn's
        prefill start to its first token, so time spent between chunks counts too: the estimate errs toward
        reading."""
        if tokens >= _MIN_PREFILL_TOKENS and seconds > 0:
            self.prefill_tokens_per_s = _blend(self.prefill_tokens_per_s, tokens / seconds)

    def keys(self) -> list[str]:
        """Keys held on disk or waiting to be written, most recently used last."""
        with self._lock:
            return list(self._files) + [k for k in self._pending if k not in self._files]

    @property
    def bytes_held(self) -> int:
        with self._lock:
            return sum(f.nbytes for f in self._files.values())

    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until every entry put so far is written (or given up). False on timeout."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending or self._writing is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._wake.wait(min(left, 0.05))
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Write what is waiting for at most ``timeout`` seconds, stop the writer and let the folder go. A worker's
        shutdown stays prompt on a slow disk: an entry still waiting then is lost, and its turn recomputed later."""
        if not self.flush(timeout):
            log.warning("disk tier: %d entries not written by shutdown; their turns will be recomputed",
                        len(self._pending))
        with self._lock:
            self._closed = True
            self._pending.clear()  # the writer ends after the file it is writing (written whole, or not at all)
            self._wake.notify_all()
        self._writer.join(timeout=timeout)
        self._lock_file.close()  # releases the flock

    def stats(self) -> dict:
        with self._lock:
            held = sum(f.nbytes for f in self._files.values())
            files = len(self._files)
        return dict(disk_bytes=held, disk_budget_bytes=self.budget, disk_files=files,
                    disk_read_bytes_per_s=self.read_bytes_per_s, disk_prefill_tokens_per_s=self.prefill_tokens_per_s,
                    **self.counters)

    # -- internals ----------------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.folder / (hashlib.sha256(key.encode()).hexdigest()[:32] + SUFFIX)

    def _index(self) -> None:
        """Index the files a previous run left: drop temporary (torn) files and files this model cannot read."""
        found = []
        for path in self.folder.iterdir():
            if path.name.endswith(".tmp"):
                path.unlink(missing_ok=True)
                continue
            if path.suffix != SUFFIX:
                continue
            try:
                header = entry_file.read_header(str(path))
                key = header.get("key")
                same = all(header.get(k) == v for k, v in self.identity.as_dict().items())
                if not isinstance(key, str) or not same or self._path(key) != path:
                    raise BadEntryFile("written for another model, dtype or layout")
                stat = path.stat()
                found.append((stat.st_mtime, key, _File(stat.st_size, len(header.get("token_ids") or ()))))
            except (BadEntryFile, OSError, ValueError, AttributeError) as exc:
                log.info("dropping disk-cache file %s (%s)", path.name, exc)
                self.counters["disk_dropped"] += 1
                path.unlink(missing_ok=True)
        for _, key, info in sorted(found, key=lambda f: f[0]):
            self._files[key] = info
        self.counters["disk_reopened"] = len(self._files)
        with self._lock:
            self._make_room(0, keep=None)

    def _write_loop(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wake.wait()
                if not self._pending:
                    return
                key = next(iter(self._pending))
                entry = self._pending.pop(key)
                self._writing = key
            try:
                self._write(key, entry)
            except Exception:  # noqa: BLE001 — a full disk or an odd tensor loses a cache file, never the worker
                log.exception("could not write disk-cache entry %s", key)
                self.counters["disk_write_errors"] += 1
            finally:
                with self._lock:
                    self._writing = None
                    self._wake.notify_all()

    def _write(self, key: str, entry) -> None:
        parts = entry_file.encode(key, entry, self.identity)
        size = entry_file.size_of(parts)
        with self._lock:
            if size > self.budget:
                self.counters["disk_too_large"] += 1
                self._drop_locked(key)  # an older, smaller version would be stale
                return
            self._make_room(size, keep=key)
        path = self._path(key)
        entry_file.write_parts(str(path), parts)
        with self._lock:
            self._files.pop(key, None)
            self._files[key] = _File(size, len(entry.token_ids))
            self.counters["disk_writes"] += 1

    def _make_room(self, incoming: int, keep: str | None) -> None:
        """Delete least recently used files until ``incoming`` more bytes fit. The file being replaced (``keep``)
        stays until its successor is renamed over it, so it counts as held; it goes too only if it must."""
        held = sum(f.nbytes for f in self._files.values())
        for key in [k for k in self._files if k != keep] + ([keep] if keep in self._files else []):
            if held + incoming <= self.budget:
                return
            held -= self._files[key].nbytes
            self._drop_locked(key)
            self.counters["disk_evictions"] += 1

    def _drop_locked(self, key: str) -> None:
        if self._files.pop(key, None) is not None:
            self._path(key).unlink(missing_ok=True)

    def _forget(self, key: str, unlink: bool) -> None:
        with self._lock:
            self._files.pop(key, None)
        if unlink:
            self._path(key).unlink(missing_ok=True)

    def _note_read(self, nbytes: int, seconds: float) -> None:
        if seconds > 0:
            self.read_bytes_per_s = _blend(self.read_bytes_per_s, nbytes / seconds)


def _blend(old: float | None, new: float) -> float:
    return new if old is None else (1 - _EWMA) * old + _EWMA * new


def _take_folder(folder: Path):
    """Hold ``folder``'s lock file for as long as the returned file stays open; FolderInUse if another holds it."""
    f = open(folder / LOCK_NAME, "a+")
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip() or "unknown"
        f.close()
        raise FolderInUse(f"the disk-cache folder {folder} (OWLET_DISK_CACHE_DIR) is in use by another process "
                          f"(pid {holder}); give each worker a folder of its own") from None
    f.seek(0)
    f.truncate()
    f.write(str(os.getpid()))
    f.flush()
    return f
