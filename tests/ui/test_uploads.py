"""Upload checks with real files: good images of every mode, and each kind of bad file."""
from __future__ import annotations

import io
import struct
import zlib

import pytest
from PIL import Image

from ui.uploads.image_check import UploadLimits, UploadRejected, check_image, read_upload

LIMITS = UploadLimits(max_bytes=2 * 1024 * 1024, max_pixels=4_000_000, max_side=256,
                      allowed_formats=("PNG", "JPEG", "WEBP", "GIF", "BMP"))


def encode(image: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **kw)
    return buf.getvalue()


def decode(data: bytes) -> Image.Image:
    """The stored image as the worker reads it (original bytes or a re-encoding), in RGB."""
    return Image.open(io.BytesIO(data)).convert("RGB")


def test_good_png_round_trips_as_rgb_png():
    image = Image.new("RGB", (40, 30), (200, 10, 10))
    checked = check_image(encode(image, "PNG"), LIMITS)
    out = decode(checked.data)
    assert (out.mode, out.size, checked.width, checked.height) == ("RGB", (40, 30), 40, 30)
    assert out.getpixel((5, 5)) == (200, 10, 10)
    assert checked.source_format == "PNG" and not checked.downscaled


@pytest.mark.parametrize("mode,color", [("RGBA", (0, 0, 255, 0)), ("LA", (0, 0)), ("P", None), ("L", 128),
                                        ("CMYK", (0, 255, 255, 0)), ("1", 1)])
def test_every_mode_becomes_rgb(mode, color):
    image = Image.new(mode, (20, 20), color) if color is not None else Image.new("RGB", (20, 20), "green").convert("P")
    fmt = "JPEG" if mode == "CMYK" else "PNG"
    out = decode(check_image(encode(image, fmt), LIMITS).data)
    assert out.mode == "RGB" and out.size == (20, 20)
    if mode in ("RGBA", "LA"):
        assert out.getpixel((3, 3)) == (255, 255, 255)  # fully transparent flattens onto white
    if mode == "L":
        assert out.getpixel((3, 3)) == (128, 128, 128)


def test_transparent_palette_image_flattens_onto_white():
    image = Image.new("P", (10, 10), 0)
    image.putpalette([0, 0, 0] * 256)
    buf = encode(image, "PNG", transparency=0)
    out = decode(check_image(buf, LIMITS).data)
    assert out.getpixel((1, 1)) == (255, 255, 255)


def test_exif_orientation_is_applied():
    # A 60x20 image tagged "rotate 90 CW" (orientation 6) must come out 20x60, with the red left edge on top.
    image = Image.new("RGB", (60, 20), (0, 0, 255))
    for y in range(20):
        for x in range(10):
            image.putpixel((x, y), (255, 0, 0))
    exif = Image.Exif()
    exif[0x0112] = 6
    checked = check_image(encode(image, "JPEG", exif=exif, quality=95), LIMITS)
    out = decode(checked.data)
    assert out.size == (20, 60)
    red, green, blue = out.getpixel((10, 3))
    assert red > 200 and blue < 60, out.getpixel((10, 3))


def test_large_image_is_downscaled_to_max_side():
    checked = check_image(encode(Image.new("RGB", (1000, 500), "white"), "PNG"), LIMITS)
    assert (checked.width, checked.height) == (256, 128) and checked.downscaled


def test_corrupt_bytes_are_rejected():
    with pytest.raises(UploadRejected, match="not an image"):
        check_image(b"this is not an image at all" * 10, LIMITS)


def test_truncated_image_is_rejected_as_damaged():
    data = encode(Image.effect_noise((200, 200), 64).convert("RGB"), "PNG")
    with pytest.raises(UploadRejected, match="damaged|not an image"):
        check_image(data[: len(data) // 2], LIMITS)


def test_wrong_type_is_rejected_by_content_not_name(tmp_path):
    pdf = tmp_path / "picture.png"  # lies about its type
    pdf.write_bytes(b"%PDF-1.4\n1 0 obj << >> endobj\ntrailer << >>\n%%EOF\n")
    with pytest.raises(UploadRejected, match="Supported types: PNG"):
        check_image(read_upload(str(pdf), LIMITS), LIMITS)


def test_real_image_of_a_format_not_allowed_is_rejected():
    tiff = encode(Image.new("RGB", (8, 8)), "TIFF")
    with pytest.raises(UploadRejected, match="TIFF images are not supported"):
        check_image(tiff, LIMITS)


def test_huge_byte_size_is_rejected_before_reading(tmp_path):
    big = tmp_path / "big.png"
    with open(big, "wb") as fh:
        fh.truncate(LIMITS.max_bytes + 1)  # sparse: no need to write 2 MB
    with pytest.raises(UploadRejected, match="limit is 2.0 MB"):
        read_upload(str(big), LIMITS)


def test_empty_file_is_rejected():
    with pytest.raises(UploadRejected, match="empty"):
        check_image(b"", LIMITS)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def decompression_bomb_png(side: int) -> bytes:
    """A tiny valid PNG that claims side×side pixels of one grey byte each (deflate squeezes zeros ~1000:1)."""
    header = struct.pack(">IIBBBBB", side, side, 8, 0, 0, 0, 0)
    compressor = zlib.compressobj(9)
    row = b"\x00" * (side + 1)
    data = b"".join(compressor.compress(row) for _ in range(side)) + compressor.flush()
    return b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", data) + _png_chunk(b"IEND", b"")


def test_decompression_bomb_is_rejected_from_the_header():
    bomb = decompression_bomb_png(5000)  # 25 megapixels in about 25 KB
    assert len(bomb) < 100_000
    with pytest.raises(UploadRejected, match="5000×5000 pixels; the limit is 4 megapixels"):
        check_image(bomb, LIMITS)


def test_bomb_beyond_pillows_own_limit_is_rejected_too():
    # 20000x20000 = 400 MP > 2 × Pillow's MAX_IMAGE_PIXELS: Pillow raises at open; still a clear message.
    header = struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0)
    bomb = b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", header) + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 100)) \
        + _png_chunk(b"IEND", b"")
    with pytest.raises(UploadRejected, match="pixels; the limit is 4 megapixels"):
        check_image(bomb, LIMITS)


def test_common_formats_not_allowed_are_named_from_their_signature():
    """Only the allowed formats' parsers read an upload; a phone's HEIC or an editor's TIFF is still named."""
    heic = b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic" + b"\x00" * 64
    avif = b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf" + b"\x00" * 64
    for data, name in ((heic, "HEIC"), (avif, "AVIF"), (b"8BPS\x00\x01" + b"\x00" * 64, "PSD")):
        with pytest.raises(UploadRejected, match=f"^{name} images are not supported. Supported types: PNG"):
            check_image(data, LIMITS)


def test_decode_verdicts_are_bounded_in_number_and_bytes():
    """Every new picture leaves a verdict; small ones never reach the byte bound, so the count bounds them."""
    from ui.uploads.decode_verdicts import MAX_ENTRIES, DecodeVerdicts, content_key
    from ui.uploads.image_check import CheckedImage

    verdicts = DecodeVerdicts()
    for i in range(MAX_ENTRIES + 300):
        data = i.to_bytes(4, "big") * 500
        scope = ("limits", f"198.51.100.{i % 200}")
        verdicts.record((f"/uploads/{i}.png", len(data), i, scope), content_key(data, scope),
                        CheckedImage(data, "PNG", 32, 32, "PNG", False, True))
    assert len(verdicts._by_content) == MAX_ENTRIES and len(verdicts._by_file) == MAX_ENTRIES
    newest = MAX_ENTRIES + 299
    assert verdicts.by_file((f"/uploads/{newest}.png", 2000, newest, ("limits", f"198.51.100.{newest % 200}")))
    assert verdicts.by_file(("/uploads/0.png", 2000, 0, ("limits", "198.51.100.0"))) is None, "the oldest stayed"

    small = DecodeVerdicts(max_image_bytes=10_000)
    for i in range(20):  # 2,000 bytes each: five fit
        data = bytes([i]) * 2000
        small.record(None, content_key(data, "s"), CheckedImage(data, "PNG", 1, 1, "PNG", False, True))
    assert small._image_bytes <= 10_000 and len(small._by_content) == 5


def test_a_stand_in_for_a_picture_over_the_limit_is_refused_with_its_size():
    """The page's script uploads a stand-in for a picture over the upload limit (ui/page_script.py): the turn is refused
    with the sentence any picture over the limit gets, naming the real picture's size."""
    from ui.uploads.stand_in import MARK, stand_in_picture, stood_in_for

    stand_in = stand_in_picture() + f"{MARK}{11 * 1024 * 1024}".encode()
    assert stood_in_for(stand_in) == 11 * 1024 * 1024
    with pytest.raises(UploadRejected) as refused:
        check_image(stand_in, LIMITS)
    assert refused.value.user_message == ("This picture is too large: 11.0 MB; the limit is 2.0 MB. Please send a "
                                          "smaller one.")
    assert Image.open(io.BytesIO(stand_in)).size == (64, 64), "the box shows it as a picture"
    ordinary = encode(Image.new("RGB", (20, 20), "red"), "PNG")
    for not_one in (ordinary, ordinary + MARK.encode(), ordinary + f"{MARK}12x".encode(), MARK.encode() + b"123"):
        assert stood_in_for(not_one) is None
    assert check_image(ordinary, LIMITS).width == 20
