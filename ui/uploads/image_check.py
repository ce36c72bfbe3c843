"""Check an uploaded image at the edge, before it reaches Redis, and normalise it.

In order: a stand-in for a picture over the upload limit (``ui.uploads.stand_in``), byte size, then the
container's structure (``worker.store.image_structure``: a file built to be slow to
parse or decode, such as a JPEG of thousands of progressive scans, is refused before Pillow reads it), then the
container type (sniffed from the bytes, not the file name), then the pixel count read from the header (so a
decompression bomb is refused before it is decoded), then a full decode
(JPEGs at a reduced scale when they will be downscaled anyway), EXIF orientation, conversion to RGB, and a
downscale to the configured longest side.

What is stored is compact: the original bytes when they already pass every check and need no change (a PNG, JPEG or WebP
the model can read as it is, not padded with more bytes than its pixels need), otherwise the normalised image re-encoded
(JPEG for photos that were JPEGs, PNG for the rest). Decoding costs CPU and memory, so the page runs it in a pool of its
own (``DecodePool``), never in the thread pool that every handler shares.

Every refusal raises ``UploadRejected`` whose ``user_message`` says what was wrong and what to do.
"""
from __future__ import annotations

import asyncio
import io
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

from ui.shared.address_slots import AddressSlots
from ui.uploads.decode_verdicts import DecodeVerdicts, content_key, file_key
from ui.uploads.stand_in import stood_in_for
from worker.store.image_structure import structure_problem


class UploadRejected(ValueError):
    """The upload cannot be used; ``user_message`` is safe to show in the chat."""

    metric_kind, http_status, api_code = "image_rejected", 400, "invalid_image"

    def __init__(self, user_message: str):
        super().__init__(user_message)
        self.user_message = user_message


@dataclass(frozen=True)
class UploadLimits:
    max_bytes: int
    max_pixels: int
    max_side: int
    allowed_formats: tuple[str, ...]

    @classmethod
    def from_config(cls, config) -> "UploadLimits":
        return cls(config.max_upload_bytes, config.max_image_pixels, config.max_image_side,
                   tuple(f.upper() for f in config.allowed_formats))


@dataclass(frozen=True)
class CheckedImage:
    data: bytes  # what to store: the original bytes, or the normalised image re-encoded
    format: str  # the format of ``data``
    width: int
    height: int
    source_format: str
    downscaled: bool
    kept_original: bool


# Stored as uploaded when nothing needs changing: formats the worker decodes directly, modes without alpha.
_KEEPABLE_FORMATS = ("PNG", "JPEG", "WEBP")
_KEEPABLE_MODES = ("RGB", "L")
_EXIF_ORIENTATION = 0x0112


# Bytes a picture may take per pixel and still be stored as uploaded; beyond that it is carrying something other
# than its pixels (metadata, comments, trailing bytes) and is stored re-encoded. Without this, one client filled the
# service's whole picture store (every new picture refused, for a day) with 1024x1024 JPEGs padded with 8 MB of
# comment segments, each charged and held at 10 MB. PNG may hold raw pixels (noise compresses to nothing), a
# JPEG or WebP even at top quality takes well under 2 bytes a pixel; the allowance covers small files' headers.
_BYTES_PER_PIXEL = {"PNG": 3.0, "JPEG": 2.0, "WEBP": 2.0}
_HEADER_ALLOWANCE = 64 * 1024


def padded(size: int, width: int, height: int, fmt: str) -> bool:
    """Whether ``size`` bytes are more than a ``fmt`` picture of this many pixels needs."""
    return size > width * height * _BYTES_PER_PIXEL.get(fmt, 3.0) + _HEADER_ALLOWANCE


def _mb(n: int) -> str:
    """A size as people read it: MB from one MB up, KB below (a small limit is not "0.0 MB")."""
    if n >= 1024 * 1024:
        return f"{n / (1024 * 1024):.1f} MB"
    return f"{max(1, round(n / 1024))} KB"


def too_large_message(size: int, max_bytes: int) -> str:
    """The refusal of a picture of ``size`` bytes over the limit (an upload's, or an API request's)."""
    return f"This picture is too large: {_mb(size)}; the limit is {_mb(max_bytes)}. Please send a smaller one."


def read_upload(path: str, limits: UploadLimits) -> bytes:
    """Read an uploaded file, refusing it by its size on disk before reading it into memory."""
    try:
        size = os.path.getsize(path)
    except OSError:
        raise UploadRejected("The uploaded file could not be read. Please upload it again.") from None
    if size > limits.max_bytes:
        raise UploadRejected(too_large_message(size, limits.max_bytes))
    with open(path, "rb") as fh:
        return fh.read(limits.max_bytes + 1)


# A JPEG is decoded at 1/2, 1/4 or 1/8 scale when it will be shrunk anyway, so the pixel cap applies to what is
# decoded: a phone's 20-48 MP photo (5000x4000 was refused by the 16 MP cap) decodes at a
# quarter or an eighth of its pixels. Up to this many times the cap is read from the header at all.
JPEG_DRAFT_ALLOWANCE = 4


def check_image(data: bytes, limits: UploadLimits) -> CheckedImage:
    """Validate and normalise image bytes; raises ``UploadRejected`` with a user-facing reason."""
    stood_in = stood_in_for(data)  # the page's script sent this in place of a picture over the limit
    if stood_in is not None:
        raise UploadRejected(too_large_message(max(stood_in, limits.max_bytes + 1), limits.max_bytes))
    if len(data) > limits.max_bytes:
        raise UploadRejected(too_large_message(len(data), limits.max_bytes))
    if not data:
        raise UploadRejected("The uploaded file is empty.")
    allowed = ", ".join(limits.allowed_formats)
    problem = structure_problem(data)  # a container built to be slow to parse: refused before Pillow parses it
    if problem:
        raise UploadRejected(problem)
    try:
        # Image.open reads only the header: format and size, no pixel data yet.
        # Pillow's own bomb check (an error at twice its limit) is a backstop; ours below is lower.
        # Only the allowed formats' parsers see the bytes (Pillow would otherwise try every plugin it has).
        image = Image.open(io.BytesIO(data), formats=limits.allowed_formats)
    except Image.DecompressionBombError:
        raise UploadRejected(_too_many_pixels_message(None, limits)) from None
    except UnidentifiedImageError:
        named = _known_other_format(data)
        if named:
            raise UploadRejected(f"{named} images are not supported. Supported types: {allowed}.") from None
        raise UploadRejected(f"This file is not an image we can read. Supported types: {allowed}.") from None
    except Exception:  # truncated headers raise assorted errors inside Pillow's plugins
        raise UploadRejected(f"This file is not an image we can read. Supported types: {allowed}.") from None
    fmt = (image.format or "").upper()
    if fmt not in limits.allowed_formats:
        raise UploadRejected(f"{fmt or 'This'} images are not supported. Supported types: {allowed}.")
    width, height = image.size
    if width < 1 or height < 1:
        raise UploadRejected("The image has no pixels.")
    if width * height > limits.max_pixels * (JPEG_DRAFT_ALLOWANCE if fmt == "JPEG" else 1):
        raise UploadRejected(_too_many_pixels_message((width, height), limits))
    downscaled = max(width, height) > limits.max_side
    try:
        rotated = image.getexif().get(_EXIF_ORIENTATION, 1) not in (0, 1)
        if fmt == "JPEG" and downscaled:
            # Decode at 1/2, 1/4 or 1/8 scale straight from the DCT: a fraction of the pixels and the time.
            image.draft(image.mode if image.mode in ("RGB", "L") else "RGB", (limits.max_side, limits.max_side))
        if image.size[0] * image.size[1] > limits.max_pixels:  # what will really be decoded
            raise UploadRejected(_too_many_pixels_message((width, height), limits))
        image.load()  # full decode: catches truncated or corrupt pixel data
        keep = (fmt in _KEEPABLE_FORMATS and image.mode in _KEEPABLE_MODES and not downscaled and not rotated
                and not padded(len(data), width, height, fmt))
        if keep:
            return CheckedImage(data, fmt, width, height, fmt, False, True)
        image = ImageOps.exif_transpose(image)  # phones store rotation in EXIF; the model must see it upright
        image = _to_rgb(image)
    except UploadRejected:
        raise
    except Exception:
        raise UploadRejected("The image file is damaged or incomplete and could not be decoded. "
                             "Please upload it again or try another image.") from None
    if max(image.size) > limits.max_side:
        image.thumbnail((limits.max_side, limits.max_side), Image.Resampling.LANCZOS)
    # Pixels only: Pillow writes a JPEG's comment and EXIF back from ``info``, and a comment over 64 KB made the
    # save itself fail. Orientation is applied above; a colour profile is kept when it is of ordinary size.
    icc = image.info.get("icc_profile")
    image.info = {"icc_profile": icc} if isinstance(icc, bytes) and len(icc) <= _HEADER_ALLOWANCE else {}
    out = io.BytesIO()
    stored = "JPEG" if fmt == "JPEG" else "PNG"
    image.save(out, format=stored, **({"quality": 90} if stored == "JPEG" else {"optimize": False}))
    return CheckedImage(out.getvalue(), stored, image.width, image.height, fmt, downscaled, False)


# Image formats people upload that Owlet does not take, told from their first bytes (only the allowed formats'
# parsers ever read a file, so a format that is not allowed is named from its signature, never parsed).
_OTHER_FORMATS = ((b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"8BPS", "PSD"), (b"\x00\x00\x01\x00", "ICO"),
                  (b"\x00\x00\x00\x0cjP  ", "JPEG 2000"), (b"\xff\x4f\xff\x51", "JPEG 2000"),
                  (b"\xff\x0a", "JPEG XL"), (b"\x00\x00\x00\x0cJXL ", "JPEG XL"))
_ISO_BRANDS = {b"heic": "HEIC", b"heix": "HEIC", b"mif1": "HEIF", b"msf1": "HEIF", b"heif": "HEIF", b"avif": "AVIF",
               b"avis": "AVIF"}


def _known_other_format(data: bytes) -> str | None:
    """The name of a common image format that is not allowed, from ``data``'s signature, else None."""
    head = bytes(data[:16])
    if head[4:8] == b"ftyp":
        return _ISO_BRANDS.get(head[8:12])
    return next((name for magic, name in _OTHER_FORMATS if head.startswith(magic)), None)


class DecodePool:
    """Image checks run here: a bounded pool of their own, plus a per-address limit on decodes at once.

    A decompression-heavy upload then slows only other uploads, never the handlers streaming answers. Every
    verdict is remembered (``ui.uploads.decode_verdicts``), per client address, so a file named again, or the same bytes
    uploaded again, are not decoded again for that address.
    """

    def __init__(self, workers: int, per_address: int, slot_wait_s: float = 5.0):
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="owlet-decode")
        self.slots = AddressSlots(per_address, "Another image from your network is still being checked. "
                                               "Wait a moment, then send yours again.")
        # A check waits this long for its address's decode slot before it is refused: six people behind one
        # office NAT sending pictures at once each get theirs checked in turn, not one "still being checked".
        # The wait holds no thread, only the caller's own answer slot.
        self.slot_wait_s = slot_wait_s
        self.verdicts = DecodeVerdicts()

    async def check_bytes(self, data: bytes, limits: UploadLimits, address: str) -> CheckedImage:
        """``check`` for bytes a request carried (an API picture) rather than an uploaded file: the same checks,
        slot and remembered verdicts, by content only."""
        return await self._run(self._check_data, data, None, limits, address)

    async def check(self, path: str, limits: UploadLimits, address: str) -> CheckedImage:
        """Check one upload for ``address``; raises UploadRejected, or SlotRefused when it has too many going.

        The address's slot is held until the decode itself ends, not until this call does: a client that
        cancels its request mid-decode (the thread cannot be stopped) would otherwise get the slot back at once
        and could keep every decode thread busy with decodes nobody waits for."""
        # Per address: shared by everyone, a fast verdict would tell a stranger that someone uploaded those bytes.
        file = file_key(path, (limits, address))
        known = self.verdicts.by_file(file)
        if known is not None:
            return _verdict(known)
        return await self._run(self._check_file, path, file, limits, address)

    async def _run(self, check, source, file: tuple | None, limits: UploadLimits, address: str) -> CheckedImage:
        """Run ``check(source, file, limits, address)`` in the pool while holding one of the address's decode
        slots."""
        await self.slots.acquire_within(address, self.slot_wait_s)
        try:
            decode = self._pool.submit(check, source, file, limits, address)
        except BaseException:
            self.slots.release(address)
            raise
        decode.add_done_callback(lambda _done: self.slots.release(address))  # also when cancelled before it ran
        return await asyncio.wrap_future(decode)

    def _check_file(self, path: str, file: tuple | None, limits: UploadLimits, address: str) -> CheckedImage:
        return self._check_data(read_upload(path, limits), file, limits, address)

    def _check_data(self, data: bytes, file: tuple | None, limits: UploadLimits, address: str) -> CheckedImage:
        content = content_key(data, (limits, address))
        verdict = self.verdicts.by_content(content)
        if verdict is None:
            try:
                verdict = check_image(data, limits)
            except UploadRejected as exc:
                verdict = exc.user_message
        self.verdicts.record(file, content, verdict)
        return _verdict(verdict)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _verdict(verdict) -> CheckedImage:
    """The checked image, or the refusal raised again (a remembered verdict is either)."""
    if isinstance(verdict, str):
        raise UploadRejected(verdict)
    return verdict


def _to_rgb(image: Image.Image) -> Image.Image:
    """Flatten transparency onto white (what people expect to see), and map every mode to RGB."""
    if image.mode == "P" and "transparency" in image.info:
        image = image.convert("RGBA")
    if image.mode in ("RGBA", "LA", "PA"):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if image.mode == "I;16" or image.mode == "I":
        image = image.point(lambda v: v * (1 / 256)).convert("L")
    return image.convert("RGB") if image.mode != "RGB" else image


def _too_many_pixels_message(size: tuple[int, int] | None, limits: UploadLimits) -> str:
    what = f"{size[0]}×{size[1]} pixels" if size else "it has too many pixels"
    jpeg = limits.max_pixels * JPEG_DRAFT_ALLOWANCE / 1e6
    return (f"This picture is too large: {what}; the limit is {limits.max_pixels / 1e6:.0f} megapixels ({jpeg:.0f} "
            "for a JPEG photo). Please send a smaller one.")
