"""Give freed heap memory back to the system: glibc's ``malloc_trim(0)``, called every 30 s from a thread.

glibc keeps memory a process freed inside its arenas (one per thread that allocated, up to 8 x cores) and only
gives back what sits at the top of an arena. A worker or a page under steady traffic frees as much as it takes
(answers end, sessions are evicted), yet its RSS kept rising: the soak (``bench/soak.py --probe``) saw the worker's
free-but-held bytes (``mallinfo2().fordblks``) climb from 12 MB to 86 MB in four minutes. ``malloc_trim(0)``
releases the free pages of every arena (``madvise``), so RSS follows what is live. The processes also run with
``MALLOC_ARENA_MAX=2`` (owlet/demo.py, the Dockerfile), which keeps the threads from scattering frees over many
arenas in the first place.

No-op where the C library has no ``malloc_trim`` (musl, macOS). Not in the engine: a process's host, not its model,
decides how its allocator is run.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading

log = logging.getLogger(__name__)


def _malloc_trim():
    """glibc's ``malloc_trim``, or None where there is none."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


def trim_now() -> bool:
    """Release free heap pages now; True if the C library could (glibc)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def start_trimming(interval_s: float, name: str = "owlet-malloc-trim") -> threading.Thread | None:
    """Call ``malloc_trim(0)`` every ``interval_s`` seconds in a daemon thread; None when off (``interval_s`` <= 0)
    or when the C library has no ``malloc_trim``."""
    trim = _malloc_trim() if interval_s > 0 else None
    if trim is None:
        if interval_s > 0:
            log.info("malloc_trim is not available in this C library: freed memory is left to the allocator")
        return None
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(interval_s):
            trim(0)

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.stop = stop  # type: ignore[attr-defined]  # tests end it
    thread.start()
    return thread
