"""The pictures of a reopened conversation, shown again instead of a "🖼️ (image)" placeholder.

A reload reopens the browser's last conversation from Redis, where its pictures are kept by their bytes' sha256;
the files the browser once uploaded are gone from this tab (and from Gradio's upload cache after an hour). So the
stored bytes are written back into the upload folder, as an upload would be, and recorded as uploaded by the
caller's address (``ui.uploads.owners``): served to that address only, so the file a reload writes answers no
stranger's "did anyone upload this picture?".
"""
from __future__ import annotations

import logging
from pathlib import Path

from gradio.processing_utils import hash_bytes
from gradio.utils import get_upload_folder

from ui.uploads.owners import UploadedPaths

log = logging.getLogger("owlet.ui")

_EXTENSIONS = ((b"\x89PNG", ".png"), (b"\xff\xd8", ".jpg"), (b"GIF8", ".gif"), (b"BM", ".bmp"))


def extension(data: bytes) -> str:
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return ".webp"
    return next((ext for magic, ext in _EXTENSIONS if data.startswith(magic)), ".img")


def write_back(pictures: dict[str, bytes], address: str, uploads: UploadedPaths, folder: str | None = None,
               ) -> dict[str, str]:
    """Write each picture (sha256 -> bytes) into the upload folder for ``address``; returns sha256 -> path."""
    paths = {}
    for sha, data in pictures.items():
        try:
            target = Path(folder or get_upload_folder()) / hash_bytes(data) / f"picture-{sha[:12]}{extension(data)}"
            if not (target.is_file() and target.stat().st_size == len(data)):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except OSError:
            log.warning("could not write a reopened conversation's picture back", exc_info=True)
            continue
        uploads.record(address, str(target))
        paths[sha] = str(target)
    return paths
