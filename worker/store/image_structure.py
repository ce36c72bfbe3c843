"""Refuse image files whose structure, not their pixel count, would cost minutes of CPU, before Pillow reads them.

Pillow parses containers in Python, block by block, before any pixel is decoded, and a few byte patterns make
that (or the decode) slow within the upload limit (times measured with Pillow 12 on a 2-core machine):

- **GIF comments**: every one-byte sub-block of a comment extension is appended to a ``bytes`` object, which is
  quadratic: 320,000 of them (640 KB) took 1.9 s in ``Image.open``, and a 10 MB file would take minutes, with
  the GIL held, so every stream on the page slowed too.
- **PNG chunks**: 870,000 empty ancillary chunks (10 MB) took 5.1 s to check at the page and 5.8 s to load in
  the worker.
- **JPEG markers**: 2.5 million empty comment segments before the image (10 MB) took 4.2 s, 4.4 s in the worker.
- **BMP run-length data**: Pillow decodes RLE4 and RLE8 bitmaps in Python, a byte at a time, and pads every
  line the file ends early one byte per step: a 17 KB RLE8 file of 4000x4000 took 4.6 s, a 1 KB one of
  16,000,000x1 4.6 s. Real BMPs are stored uncompressed; a compressed one is refused, whatever its size.
- **JPEG scans**: a progressive JPEG is decoded scan by scan, each a pass over every pixel whatever its size in
  bytes: a flat 1024x1024 picture padded to 100 KB with 8,000 tiny scans took 9.3 s to decode (a 10 MB one,
  minutes). Encoders write 10 scans (libjpeg's default script) to about 20.

Real files have a handful of blocks before the image (a PNG a few dozen chunks, more only with small IDAT
chunks; a JPEG a dozen or two segments before its first scan; a GIF a few extensions), so the limits below are
far from anything a camera or an editor writes, and each walk is a few thousand steps at most. The page refuses
such files with a sentence (``ui.uploads.image_check``), and the worker does too for bytes that reached Redis some
other way.
"""
from __future__ import annotations

import struct

MAX_GIF_EXTENSION_BLOCKS = 4096  # sub-blocks of all extensions before the first image
MAX_PNG_CHUNKS = 8192  # a 10 MB PNG written in 8 KB IDAT chunks has about 1,300
MAX_JPEG_SEGMENTS = 512  # marker segments before the first scan (and fill or stray bytes, counted alike)
MAX_JPEG_SCANS = 64

_TOO_COMPLEX = ("This image file holds far more {what} than any picture needs, and checking it would take "
                "minutes. Save it again from an image editor (as PNG or JPEG) and upload that.")


def structure_problem(data: bytes) -> str | None:
    """A user-facing sentence when ``data``'s container is built to be slow to parse, else None. Files this does
    not recognise, or that end early, are left to Pillow (which refuses what it cannot read)."""
    data = bytes(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _png(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg(data) or _jpeg_scans(data)
    if data[:2] == b"BM":
        return _bmp(data)
    return None


def jpeg_scans(data: bytes) -> int:
    """How many start-of-scan markers (FF DA) ``data`` holds. Inside compressed data an FF byte is always
    followed by 00 or a restart marker, so every FF DA is a marker; one inside a header segment (an embedded
    thumbnail) only counts a few too many."""
    return bytes(data).count(b"\xff\xda")


def _jpeg_scans(data: bytes) -> str | None:
    scans = jpeg_scans(data)
    if scans <= MAX_JPEG_SCANS:
        return None
    return (f"This JPEG is stored in {scans} progressive passes; Owlet accepts at most {MAX_JPEG_SCANS}. "
            "Save it again as a standard JPEG or a PNG and upload that.")


def _gif(data: bytes) -> str | None:
    if len(data) < 13:
        return None
    flags = data[10]
    at = 13 + (3 * 2 ** ((flags & 7) + 1) if flags & 0x80 else 0)  # the global colour table
    blocks = 0
    while at < len(data):
        introducer = data[at]
        if introducer != 0x21:  # an image descriptor (0x2C), the trailer, or damage: the header part is over
            return None
        at += 2  # 0x21 and the extension's label
        while at < len(data):
            size = data[at]
            at += 1 + size
            if size == 0:
                break
            blocks += 1
            if blocks > MAX_GIF_EXTENSION_BLOCKS:
                return _TOO_COMPLEX.format(what="comment and extension blocks")
    return None


def _png(data: bytes) -> str | None:
    at, chunks = 8, 0
    while at + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[at:at + 8])
        chunks += 1
        if chunks > MAX_PNG_CHUNKS:
            return _TOO_COMPLEX.format(what="chunks")
        if kind == b"IEND":
            return None
        at += 12 + length  # length, type, data, CRC
    return None


def _jpeg(data: bytes) -> str | None:
    at, segments = 2, 0
    while at + 1 < len(data):
        segments += 1
        if segments > MAX_JPEG_SEGMENTS:
            return _TOO_COMPLEX.format(what="header segments")
        if data[at] != 0xFF:  # a stray byte where a marker belongs: Pillow skips it, one at a time
            at += 1
            continue
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker == 0xDA or marker == 0xD9:  # the first scan (or the end): headers are over
            return None
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            at += 2
            continue
        if at + 4 > len(data):
            return None
        at += 2 + struct.unpack(">H", data[at + 2:at + 4])[0]
    return None


_BMP_RUN_LENGTH = {1: "RLE8", 2: "RLE4"}  # the DIB header's compression field


def _bmp(data: bytes) -> str | None:
    if len(data) < 34:
        return None
    header_size = struct.unpack("<I", data[14:18])[0]
    if header_size < 40:  # the old OS/2 header has no compression field: always uncompressed
        return None
    compression = struct.unpack("<I", data[30:34])[0]
    if compression not in _BMP_RUN_LENGTH:
        return None
    return (f"This BMP is run-length compressed ({_BMP_RUN_LENGTH[compression]}), which Owlet does not decode: "
            "it is slow to read. Save it again as PNG or JPEG and upload that.")
