"""One session-cache entry as one file: what the disk tier writes and reads back.

Layout, in order::

    b"OWLETKV\\x01" | header length (u32, little-endian) | header (JSON) | payload | crc32 (u32) | b"OWLETEND"

The header names the entry's key, the model's fingerprint, the dtype, the layout (park mode, group size, format)
and, per stored tensor, where its bytes lie in the payload with their dtype and shape. The crc32 covers the header
and the payload, so a flipped bit anywhere (token ids included) is caught. A file is read back only if every
check passes: magic and trailer where they belong, the size the header declares, the checksum, and the key,
model, dtype and layout the reader expects. Anything else raises :class:`BadEntryFile` and the caller drops
the file; the turn is then recomputed.

What this module knows: bytes, tensors, ``SessionEntry``'s fields. What it does not know: budgets, folders,
when to write (``engine.kv.disk_tier`` decides that).
"""
from __future__ import annotations

import contextlib
import json
import os
import struct
import zlib
from dataclasses import dataclass

import torch

from .kv_quant import FullPrecisionTensor, QuantizedTensor

MAGIC = b"OWLETKV\x01"
TRAILER = b"OWLETEND"
FORMAT = 1
_U32 = struct.Struct("<I")
_ALIGN = 64  # each tensor's bytes start on a 64-byte boundary of the file

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.float64)}


class BadEntryFile(Exception):
    """A file that cannot be trusted: torn, truncated, corrupt, or written for another model, dtype or layout."""


@dataclass(frozen=True)
class Identity:
    """What an entry file must match to be read: written by this model, in this dtype, in this layout."""
    model: str  # fingerprint of the checkpoint (engine.kv.disk_tier.model_fingerprint)
    dtype: str  # the model's compute dtype, e.g. "float32"
    layout: str  # how K/V is stored, e.g. "int8/64/f1"

    def as_dict(self) -> dict:
        return {"model": self.model, "dtype": self.dtype, "layout": self.layout}


def encode(key: str, entry, identity: Identity) -> list:
    """``entry`` (a ``SessionEntry``) as a list of byte buffers to write one after another."""
    tensors, blobs, offset = [], [], 0

    def add(t: torch.Tensor) -> dict:
        nonlocal offset
        raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy()
        pad = -offset % _ALIGN
        if pad:
            blobs.append(b"\0" * pad)
            offset += pad
        spec = {"offset": offset, "nbytes": raw.nbytes, "dtype": _name(t.dtype), "shape": list(t.shape)}
        blobs.append(memoryview(raw))
        offset += raw.nbytes
        return spec

    def stored(s) -> dict:
        if isinstance(s, FullPrecisionTensor):
            return {"kind": "full", "data": add(s.data)}
        return {"kind": "quantized", "mode": s.mode, "data": add(s.data), "scale": add(s.scale),
                "minimum": None if s.minimum is None else add(s.minimum), "shape": list(s.shape),
                "dtype": _name(s.dtype), "group_size": s.group_size, "per_channel": s.per_channel}

    kv = {str(i): [stored(k), stored(v)] for i, (k, v) in entry.kv.items()}
    conv = {str(n): {str(i): add(s) for i, s in states.items()} for n, states in entry.conv_checkpoints.items()}
    header = json.dumps({"format": FORMAT, "key": key, **identity.as_dict(), "token_ids": entry.token_ids,
                         "hybrid": entry.hybrid, "group": entry.group, "kv": kv, "conv": conv,
                         "payload_bytes": offset}, separators=(",", ":")).encode()
    header += b" " * (-(len(MAGIC) + _U32.size + len(header)) % _ALIGN)  # the payload starts aligned too
    crc = zlib.crc32(header)
    for blob in blobs:
        crc = zlib.crc32(blob, crc)
    return [MAGIC, _U32.pack(len(header)), header, *blobs, _U32.pack(crc), TRAILER]


def size_of(parts: list) -> int:
    """Bytes ``encode``'s buffers take on disk."""
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def write_parts(path: str, parts: list) -> None:
    """Write ``encode``'s buffers to ``path`` through a temporary file renamed over it: a reader sees the old file
    or the new one, never a torn one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_header(path: str) -> dict:
    """The header alone (for indexing a folder at start): not checksummed, so never trusted for a restore."""
    with open(path, "rb") as f:
        head = f.read(len(MAGIC) + _U32.size)
        if len(head) < len(MAGIC) + _U32.size or head[:len(MAGIC)] != MAGIC:
            raise BadEntryFile("not an entry file")
        (length,) = _U32.unpack_from(head, len(MAGIC))
        raw = f.read(length)
    if len(raw) != length:
        raise BadEntryFile("truncated header")
    try:
        return json.loads(raw)
    except ValueError as exc:
        raise BadEntryFile(f"unreadable header: {exc}") from None


def read(path: str, key: str, identity: Identity) -> dict:
    """The fields of the ``SessionEntry`` stored at ``path`` (token_ids, kv, conv_checkpoints, hybrid, group), its
    tensors on the host, checked end to end; raises BadEntryFile.

    The file is read into memory the entry owns (one ``readinto``) rather than left mapped: a mapping of a file
    truncated under it would fault the process (SIGBUS), and a restore copies the bytes to the device anyway."""
    size = os.path.getsize(path)
    buf = bytearray(size)
    with open(path, "rb") as f:
        if f.readinto(buf) != size:
            raise BadEntryFile("file changed while read")
    view = memoryview(buf)
    fixed = len(MAGIC) + _U32.size
    if size < fixed + _U32.size + len(TRAILER) or view[:len(MAGIC)] != MAGIC or view[-len(TRAILER):] != TRAILER:
        raise BadEntryFile("torn or truncated (magic or trailer missing)")
    (length,) = _U32.unpack_from(buf, len(MAGIC))
    body_end = size - _U32.size - len(TRAILER)
    if fixed + length > body_end:
        raise BadEntryFile("truncated header")
    (crc,) = _U32.unpack_from(buf, body_end)
    if zlib.crc32(view[fixed:body_end]) != crc:
        raise BadEntryFile("checksum mismatch")
    try:
        header = json.loads(bytes(view[fixed:fixed + length]))
    except ValueError as exc:
        raise BadEntryFile(f"unreadable header: {exc}") from None
    payload = fixed + length
    if header.get("format") != FORMAT or body_end - payload != header.get("payload_bytes"):
        raise BadEntryFile("unknown format or wrong payload size")
    for field, want in (("key", key), *identity.as_dict().items()):
        if header.get(field) != want:
            raise BadEntryFile(f"written for another {field}: {header.get(field)!r}, not {want!r}")

    def tensor(spec: dict) -> torch.Tensor:
        start, nbytes = payload + spec["offset"], spec["nbytes"]
        if spec["offset"] < 0 or start + nbytes > body_end:
            raise BadEntryFile("a tensor lies outside the payload")
        flat = torch.frombuffer(buf, dtype=torch.uint8, count=nbytes, offset=start) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        return flat.view(_dtype(spec["dtype"])).reshape(spec["shape"])

    def stored(spec: dict):
        if spec["kind"] == "full":
            return FullPrecisionTensor(tensor(spec["data"]))
        minimum = None if spec["minimum"] is None else tensor(spec["minimum"])
        return QuantizedTensor(spec["mode"], tensor(spec["data"]), tensor(spec["scale"]), minimum,
                               tuple(spec["shape"]), _dtype(spec["dtype"]), spec["group_size"], spec["per_channel"])

    try:
        kv = {int(i): (stored(k), stored(v)) for i, (k, v) in header["kv"].items()}
        conv = {int(n): {int(i): tensor(s) for i, s in states.items()} for n, states in header["conv"].items()}
        return dict(token_ids=[int(t) for t in header["token_ids"]], kv=kv, conv_checkpoints=conv,
                    hybrid=bool(header["hybrid"]), group=header["group"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise BadEntryFile(f"malformed tensors: {exc}") from None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise BadEntryFile(f"unknown dtype {name!r}")
    return _DTYPES[name]

