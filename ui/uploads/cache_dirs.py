"""What one upload request may leave in Gradio's upload cache: one file, and no directory once the file is gone.

Gradio's upload route accepts up to 1,000 files in one request and puts each distinct file in a directory of
its own (named by the file's SHA-256). Its cache cleaner deletes old files but never their directories. Byte
budgets (``ui.uploads.budget``) bound the bytes, not the count: one client sending many tiny distinct files
would have left hundreds of thousands of directories behind, enough to use up a disk's inodes, after which no
upload and, on a shared host, nothing else can create a file.

So the page's uploads carry one file each (``ui.gradio_adapters.upload_parser``), every upload is charged at least
``MIN_UPLOAD_CHARGE_BYTES`` of its address's budget, and a sweeper removes the empty directories the cleaner leaves.
"""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

# Every upload makes a file and a directory however small it is; charging each at least this much of the
# address's byte budget caps how many one address makes (128 MB per 10 min: 2,048 uploads).
MIN_UPLOAD_CHARGE_BYTES = 64 * 1024


def sweep_empty_dirs(root: Path, min_age_s: float, now: float | None = None) -> int:
    """Remove the empty directories directly under ``root`` left unchanged for ``min_age_s``; return how many.

    The age guard keeps a directory Gradio has just made for an upload in progress (made, then the file moved
    in); a directory that is not empty is never touched."""
    now = time.time() if now is None else now
    removed = 0
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return 0
    for entry in entries:
        try:
            if not entry.is_dir(follow_symlinks=False) or now - entry.stat(follow_symlinks=False).st_mtime < min_age_s:
                continue
            os.rmdir(entry.path)  # fails on a directory that is not empty
            removed += 1
        except OSError:
            continue
    return removed


class EmptyDirSweeper:
    """A daemon thread running ``sweep_empty_dirs(root, min_age_s)`` every ``interval_s``."""

    def __init__(self, root: Path, interval_s: float, min_age_s: float = 60.0):
        self.root, self.interval_s, self.min_age_s = Path(root), interval_s, min_age_s
        self.removed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="owlet-upload-dir-sweeper", daemon=True)

    def start(self) -> "EmptyDirSweeper":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.removed += sweep_empty_dirs(self.root, self.min_age_s)


def start_upload_dir_sweeper(cache_ttl_s: float) -> EmptyDirSweeper:
    """Sweep Gradio's upload folder as often as its cleaner runs (every ``cache_ttl_s``), but at least every 10
    minutes, so the directories of deleted uploads go within one sweep of their files."""
    from gradio.utils import get_upload_folder

    return EmptyDirSweeper(Path(get_upload_folder()), interval_s=min(cache_ttl_s, 600.0)).start()
