"""Decoding as a lever, and the upload endpoint filling the disk.

Gradio refuses a file over the real limit before it keeps it; the upload cache is cleaned on a schedule;
decodes run in a pool of their own with a per-address limit, so one client's heavy uploads neither hold
every decode slot nor slow the handlers that stream other people's answers; large JPEGs decode reduced."""
from __future__ import annotations

import asyncio
import io
import os
import struct
import time
from pathlib import Path

import httpx
import pytest
from PIL import Image
from PIL.JpegImagePlugin import JpegImageFile

from tests.security.attack import LIMITS
from ui.config import UIConfig
from ui.shared.address_slots import SlotRefused
from ui.uploads.image_check import DecodePool, UploadLimits, UploadRejected, check_image

pytestmark = pytest.mark.timeout(300)


def upload_dirs() -> list[Path]:
    """Where Gradio keeps uploads (GRADIO_TEMP_DIR, default /tmp/gradio)."""
    return [Path(os.environ.get("GRADIO_TEMP_DIR", "/tmp/gradio"))]


def big_files(since: float, over: int) -> list[Path]:
    return [p for d in upload_dirs() if d.exists() for p in d.rglob("*")
            if p.is_file() and p.stat().st_mtime >= since and p.stat().st_size > over]


def test_a_30_mb_non_image_is_refused_before_it_is_kept(stack):
    started = time.time() - 1
    junk = os.urandom(30 * 1024 * 1024)
    response = httpx.post(stack.url + "gradio_api/upload", files={"files": ("junk.png", junk)}, timeout=120)
    assert response.status_code in (400, 413), (response.status_code, response.text[:200])
    assert not big_files(started, LIMITS["upload_bytes"]), "nothing over the limit was written to disk"


def test_the_upload_limit_is_owlets_own_and_the_cache_is_cleaned(stack):
    """Gradio's own limit is off (its front end dropped a bigger picture with a toast and sent the question without
    it); the upload route's parser takes Owlet's limit, so a bigger file is still refused as it arrives."""
    from gradio import route_utils

    from ui.server import build

    config = UIConfig(max_upload_bytes=LIMITS["upload_bytes"], upload_cache_ttl_s=600,
                      redis_url=stack.redis_url, key_prefix=stack.prefix)
    page, launch_kwargs, client, _metrics = build(config)
    try:
        assert launch_kwargs["max_file_size"] is None
        assert route_utils.GradioMultiPartParser.owlet_max_file_bytes == config.max_upload_bytes
        assert page.delete_cache == (600, 600)
    finally:
        client.close()


def noise_png(side: int) -> bytes:
    buf = io.BytesIO()
    Image.effect_noise((side, side), 50).convert("RGB").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def test_decodes_are_limited_per_address_and_leave_the_shared_pool_free(tmp_path):
    heavy = tmp_path / "heavy.png"
    heavy.write_bytes(noise_png(3000))  # 9 MP: a real decode, below the pixel cap
    light = tmp_path / "light.png"
    light.write_bytes(noise_png(64))
    limits = UploadLimits(max_bytes=64 * 1024 * 1024, max_pixels=16_000_000, max_side=1024,
                          allowed_formats=("PNG", "JPEG"))
    pool = DecodePool(workers=2, per_address=1, slot_wait_s=0)

    async def scenario():
        first = asyncio.create_task(pool.check(str(heavy), limits, "203.0.113.61"))
        await asyncio.sleep(0.05)
        with pytest.raises(SlotRefused, match="still being checked"):
            await pool.check(str(heavy), limits, "203.0.113.61")
        other = await pool.check(str(light), limits, "198.51.100.61")  # another address is not held up
        t0 = time.monotonic()
        await asyncio.to_thread(lambda: None)  # the pool every handler shares is not busy decoding
        shared_wait = time.monotonic() - t0
        assert not first.done(), "the heavy decode was still running while the others were served"
        return await first, other, shared_wait

    try:
        heavy_checked, light_checked, shared_wait = asyncio.run(scenario())
    finally:
        pool.close()
    assert heavy_checked.downscaled and light_checked.kept_original
    assert shared_wait < 0.5, shared_wait


def test_a_check_waits_a_moment_for_its_address_slot_before_it_is_refused(tmp_path):
    """Several people behind one address sending pictures at once: each is checked in turn (not one of six refused
    with "still being checked"); only a wait longer than ``slot_wait_s`` is refused."""
    heavy = tmp_path / "heavy.png"
    heavy.write_bytes(noise_png(2000))
    limits = UploadLimits(max_bytes=64 * 1024 * 1024, max_pixels=16_000_000, max_side=1024,
                          allowed_formats=("PNG", "JPEG"))
    patient = DecodePool(workers=2, per_address=1, slot_wait_s=120)
    hasty = DecodePool(workers=2, per_address=1, slot_wait_s=0.1)

    async def scenario():
        copies = []
        for i in range(3):  # other bytes each, so no remembered verdict answers
            copy = tmp_path / f"c{i}.png"
            copy.write_bytes(noise_png(2000))
            copies.append(str(copy))
        together = await asyncio.gather(*(patient.check(c, limits, "203.0.113.63") for c in copies))
        assert all(c.downscaled for c in together), "all three checked, one after another"
        first = asyncio.create_task(hasty.check(str(heavy), limits, "203.0.113.64"))
        await asyncio.sleep(0.05)
        with pytest.raises(SlotRefused, match="still being checked"):
            await hasty.check(copies[0], limits, "203.0.113.64")
        await first

    try:
        asyncio.run(scenario())
    finally:
        patient.close()
        hasty.close()


def test_pixel_cap_and_reduced_jpeg_decoding(monkeypatch):
    assert UIConfig().max_image_pixels == 16_000_000
    buf = io.BytesIO()
    Image.effect_noise((4000, 3000), 50).convert("RGB").save(buf, format="JPEG", quality=85)
    limits = UploadLimits(max_bytes=64 * 1024 * 1024, max_pixels=16_000_000, max_side=1024,
                          allowed_formats=("JPEG",))
    decoded = []  # the size each JPEG decode really produced (a count of work, not a timing)
    load = JpegImageFile.load

    def counted_load(image):
        decoded.append(image.size)
        return load(image)
    monkeypatch.setattr(JpegImageFile, "load", counted_load)
    checked = check_image(buf.getvalue(), limits)
    assert checked.format == "JPEG" and max(checked.width, checked.height) == 1024
    # Decoded straight from the DCT at a reduced scale: at most a quarter of the 12 MP were ever produced.
    assert decoded and all(w * h <= 4000 * 3000 // 4 for w, h in decoded), decoded
    big = io.BytesIO()
    Image.new("L", (5000, 4000)).save(big, format="PNG")  # 20 MP of zeros: a few KB that would decode to 20 MB
    with pytest.raises(Exception, match="16 megapixels"):
        check_image(big.getvalue(), UploadLimits(64 * 1024 * 1024, 16_000_000, 1024, ("PNG",)))


def test_a_phone_sized_jpeg_is_decoded_small_and_accepted_while_other_formats_keep_the_cap(monkeypatch):
    """A 24 MP phone photo was refused by the 16 MP cap although it is decoded at a quarter of its pixels anyway;
    the cap now applies to what is decoded. Past 4x the cap, and for every format Pillow
    must decode whole, it is read from the header and refused as before."""
    limits = UploadLimits(max_bytes=64 * 1024 * 1024, max_pixels=16_000_000, max_side=1024,
                          allowed_formats=("JPEG", "PNG"))
    decoded = []
    load = JpegImageFile.load

    def counted_load(image):
        decoded.append(image.size)
        return load(image)
    monkeypatch.setattr(JpegImageFile, "load", counted_load)

    def jpeg(size) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", size, (200, 30, 30)).save(out, format="JPEG", quality=80)
        return out.getvalue()

    checked = check_image(jpeg((6000, 4000)), limits)
    assert (checked.width, checked.height) == (1024, 683) and checked.downscaled
    assert decoded and all(w * h <= 6000 * 4000 // 4 for w, h in decoded), decoded  # a quarter, or less
    with pytest.raises(UploadRejected, match="16 megapixels"):
        check_image(jpeg((9000, 8000)), limits)  # 72 MP: past four times the cap
    with pytest.raises(UploadRejected, match="16 megapixels"):
        check_image(jpeg((6000, 4000)), UploadLimits(64 * 1024 * 1024, 16_000_000, 8000, ("JPEG",)))  # kept whole


def test_edit_applies_the_same_text_limit_as_chat():
    import gradio as gr

    from tests.redis_server import running_redis, unique_prefix
    from ui.chat.handlers import ChatHandlers
    from ui.chat.tab_state import new_tab_state
    from ui.ops.metrics import UIMetrics
    from worker.client import OwletClient
    from worker.config import Settings

    with running_redis() as url:
        prefix = unique_prefix("sec-edit")
        client = OwletClient(settings=Settings.from_env(redis_url=url, key_prefix=prefix))
        config = UIConfig(redis_url=url, key_prefix=prefix, max_text_chars=100)
        h = ChatHandlers(client, config, UIMetrics())
        try:
            token = h.issuer.mint()
            sub = client.submit(f"anon:{h.issuer.verify(token)}", None, "short question")
            session = {**new_tab_state(), "conversation": sub.conv}
            edit = gr.EditData(None, {"index": 0, "value": "x" * 101, "previous_value": "short question"})

            async def run():
                return [u async for u in h.edit(16, session, token, edit, gr.Request(session_hash="e"))]

            [(_box, _chat, status, _session)] = asyncio.run(run())
            assert status == f"Your message is longer than {config.max_text_chars} characters. Please shorten it."
            assert client.job_state(sub.job) == "queued", "the pending turn was not cancelled"
            assert len(client.history(f"anon:{h.issuer.verify(token)}", sub.conv)) == 1, "nothing truncated"
        finally:
            h.decoder.close()
            client.close(purge=True)


def test_a_cancelled_check_keeps_its_address_slot_until_the_decode_ends(tmp_path):
    """A decode thread cannot be stopped: a client cancelling its request mid-decode used to get its slot back
    at once, so one address could start decode after decode and keep every decode thread busy."""
    heavy = tmp_path / "heavy.png"
    heavy.write_bytes(noise_png(3000))
    limits = UploadLimits(max_bytes=64 * 1024 * 1024, max_pixels=16_000_000, max_side=1024,
                          allowed_formats=("PNG", "JPEG"))
    pool = DecodePool(workers=2, per_address=1, slot_wait_s=0)
    address = "203.0.113.62"

    async def scenario():
        first = asyncio.create_task(pool.check(str(heavy), limits, address))
        await asyncio.sleep(0.05)
        first.cancel()  # the client went away; its decode goes on in the pool
        with pytest.raises(asyncio.CancelledError):
            await first
        assert pool.slots.held(address) == 1, "the slot is held while the abandoned decode runs"
        with pytest.raises(SlotRefused):
            await pool.check(str(heavy), limits, address)
        deadline = time.monotonic() + 60
        while pool.slots.held(address) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert pool.slots.held(address) == 0, "and given back when the decode ends"
        return await pool.check(str(heavy), limits, address)

    try:
        assert asyncio.run(scenario()).downscaled
    finally:
        pool.close()


def scan_bomb(extra_scans: int, size=(1024, 1024)) -> bytes:
    """A flat progressive JPEG padded with ``extra_scans`` copies of its smallest AC scan: each is one more
    decode pass over every pixel, for 12 bytes."""
    buf = io.BytesIO()
    Image.new("RGB", size, (128, 128, 128)).save(buf, format="JPEG", progressive=True)
    data = buf.getvalue()
    scans, at = [], data.find(b"\xff\xda")
    while at != -1:
        end = data.find(b"\xff\xda", at + 2)
        scans.append(data[at:end if end != -1 else len(data) - 2])
        at = end
    smallest = min(scans, key=len)
    return data[:-2] + smallest * extra_scans + data[-2:]


def test_a_progressive_jpeg_with_thousands_of_scans_is_refused_before_it_is_decoded():
    """A 100 KB file took 1.2 s of CPU to decode (0.15 ms a scan at 1024x1024), a 10 MB one about 134 s, and was
    stored as uploaded, so every job and every retry made a worker decode it again."""
    from worker.errors import InvalidInput
    from worker.store.image_structure import MAX_JPEG_SCANS, jpeg_scans
    from worker.store.images import ImageStore

    limits = UploadLimits(10 << 20, 50_000_000, 2048, ("PNG", "JPEG", "WEBP"))
    honest = scan_bomb(0)
    assert 2 <= jpeg_scans(honest) <= 20, "an ordinary progressive JPEG: a handful of scans"
    assert check_image(honest, limits).kept_original
    bomb = scan_bomb(8000)
    assert jpeg_scans(bomb) > MAX_JPEG_SCANS
    started = time.process_time()
    with pytest.raises(UploadRejected) as refused:
        check_image(bomb, limits)
    assert time.process_time() - started < 0.5, "refused from its markers, not after decoding"
    assert "progressive passes" in refused.value.user_message and "standard JPEG" in refused.value.user_message

    class Stored:  # the worker's own check, for bytes that reached Redis some other way
        def get(self, _key):
            return bomb
    store = ImageStore(Stored(), type("K", (), {"image": staticmethod(lambda sha: sha)})(), 60, 20 << 20)
    with pytest.raises(InvalidInput, match="progressive passes"):
        store.load("0" * 64, 512)


def _encoded(fmt: str, size=(10, 10), mode="RGB", **kw) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size).save(buf, format=fmt, **kw)
    return buf.getvalue()


def container_bombs() -> dict[str, bytes]:
    """Files whose container, not their pixels, is slow for Pillow to parse (a few hundred KB each here; 10 MB
    versions took seconds to minutes of CPU)."""
    gif = _encoded("GIF", mode="P")
    palette = 3 * 2 ** ((gif[10] & 7) + 1) if gif[10] & 0x80 else 0
    png, jpeg = _encoded("PNG"), _encoded("JPEG")
    return {
        "gif comment": gif[:13 + palette] + b"\x21\xfe" + b"\x01A" * 200_000 + b"\x00" + gif[13 + palette:],
        "png chunks": png[:33] + b"\x00\x00\x00\x00abCd\x00\x00\x00\x00" * 30_000 + png[33:],
        "jpeg segments": b"\xff\xd8" + b"\xff\xfe\x00\x02" * 100_000 + jpeg[2:],
        "jpeg stray bytes": jpeg[:20] + b"\x00" * 200_000 + jpeg[20:],
    }


@pytest.mark.parametrize("name", list(container_bombs()))
def test_containers_built_to_be_slow_to_parse_are_refused_before_pillow_reads_them(name):
    """A GIF comment of one-byte sub-blocks is quadratic in Pillow (320,000 took 1.9 s, 10 MB minutes); millions
    of empty PNG chunks or JPEG comment segments took 4-6 s per 10 MB, at the page and again in the worker."""
    from worker.errors import InvalidInput
    from worker.store.images import ImageStore

    bomb = container_bombs()[name]
    limits = UploadLimits(10 << 20, 50_000_000, 2048, ("PNG", "JPEG", "WEBP", "GIF", "BMP"))
    started = time.process_time()
    with pytest.raises(UploadRejected) as refused:
        check_image(bomb, limits)
    assert time.process_time() - started < 0.2, "refused from its structure, not after parsing it"
    assert "far more" in refused.value.user_message and "Save it again" in refused.value.user_message

    class Stored:
        def get(self, _key):
            return bomb
    store = ImageStore(Stored(), type("K", (), {"image": staticmethod(lambda sha: sha)})(), 60, 20 << 20)
    with pytest.raises(InvalidInput, match="far more"):
        store.load("0" * 64, 512)


def test_ordinary_files_of_every_format_pass_the_structure_check():
    from worker.store.image_structure import structure_problem

    noise = Image.effect_noise((640, 480), 50).convert("RGB")
    exif = noise.getexif()
    exif[0x0112] = 6
    for fmt, kw in [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("JPEG", {"exif": exif}),
                    ("GIF", {}), ("WEBP", {}), ("BMP", {}), ("PNG", {"optimize": True})]:
        buf = io.BytesIO()
        (noise.convert("P") if fmt == "GIF" else noise).save(buf, format=fmt, **kw)
        assert structure_problem(buf.getvalue()) is None, (fmt, kw)
    examples = sorted((Path(__file__).resolve().parents[2] / "ui" / "examples").glob("*.png"))
    assert examples, "the page's example images"
    for example in examples:
        assert structure_problem(example.read_bytes()) is None, example


def run_length_bmp(width: int, height: int, pixels: bytes, bits: int = 8) -> bytes:
    """A BMP whose pixel data is run-length coded (RLE8, or RLE4 with ``bits=4``)."""
    palette = b"".join(struct.pack("<BBBB", i, i, i, 0) for i in range(2 ** bits))
    info = struct.pack("<IiiHHIIiiII", 40, width, height, 1, bits, 1 if bits == 8 else 2, len(pixels), 2835, 2835,
                       2 ** bits, 0)
    offset = 14 + len(info) + len(palette)
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + palette + pixels


def test_run_length_bmps_are_refused_before_pillow_decodes_them():
    """Pillow decodes RLE bitmaps in Python: a 17 KB RLE8 file of 4000x4000 (each line one pixel, then end of line)
    took 4.6 s of CPU and a 1 KB one of 16,000,000x1 as long, on every /chat that named the uploaded file."""
    from worker.errors import InvalidInput
    from worker.store.image_structure import structure_problem
    from worker.store.images import ImageStore

    limits = UploadLimits(10 << 20, 16_000_000, 1024, ("PNG", "JPEG", "WEBP", "GIF", "BMP"))
    bombs = {"rle8 short lines": run_length_bmp(4000, 4000, b"\x01\x07\x00\x00" * 4000 + b"\x00\x01"),
             "rle8 one long line": run_length_bmp(16_000_000, 1, b"\x01\x07\x00\x00\x00\x01"),
             "rle4": run_length_bmp(4000, 4000, (b"\xff\x12" * 15 + b"\xaf\x12\x00\x00") * 4000 + b"\x00\x01", 4)}
    for name, bomb in bombs.items():
        started = time.process_time()
        with pytest.raises(UploadRejected) as refused:
            check_image(bomb, limits)
        assert time.process_time() - started < 0.2, f"{name}: refused from its header, not after decoding"
        assert "run-length compressed" in refused.value.user_message and "PNG or JPEG" in refused.value.user_message

        class Stored:
            def get(self, _key, bomb=bomb):
                return bomb
        store = ImageStore(Stored(), type("K", (), {"image": staticmethod(lambda sha: sha)})(), 60, 20 << 20)
        with pytest.raises(InvalidInput, match="run-length"):
            store.load("0" * 64, 512)
    # An ordinary (uncompressed) BMP still passes.
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 10)).save(buf, format="BMP")
    assert structure_problem(buf.getvalue()) is None
    assert check_image(buf.getvalue(), limits).width == 64


def test_an_upload_is_decoded_once_however_often_it_is_named(tmp_path, monkeypatch):
    """A refused turn costs no quota and no rate, and a client can name one uploaded file in any number of
    questions (or upload the same bytes under other names): each made the page decode it again (one 680-byte
    WEBP of 4000x4000 kept the decode pool busy so). Verdicts, refusals and checked images, are
    remembered by content; a file changed in place is checked afresh."""
    import shutil

    import ui.uploads.image_check as uploads

    good = io.BytesIO()
    Image.new("RGB", (64, 64), (1, 2, 3)).save(good, format="PNG")
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(good.getvalue()[:-40])  # truncated: refused after a decode attempt
    fine = tmp_path / "fine.png"
    fine.write_bytes(good.getvalue())
    limits = UploadLimits(10 << 20, 16_000_000, 1024, ("PNG",))
    decodes = []
    real_check = uploads.check_image
    monkeypatch.setattr(uploads, "check_image", lambda data, lim: decodes.append(len(data)) or real_check(data, lim))
    pool = DecodePool(workers=1, per_address=1)
    address = "203.0.113.70"

    async def scenario():
        for _ in range(5):
            with pytest.raises(UploadRejected, match="damaged or incomplete"):
                await pool.check(str(damaged), limits, address)
        assert len(decodes) == 1, "refused once, then from memory"
        for i in range(3):
            assert (await pool.check(str(fine), limits, address)).width == 64
            copy = tmp_path / f"copy{i}.png"  # the same bytes, uploaded again under another name
            shutil.copy(fine, copy)
            assert (await pool.check(str(copy), limits, address)).width == 64
        assert len(decodes) == 2, "checked once, then from memory, whatever its name"
        assert pool.slots.held(address) == 0
        damaged.write_bytes(good.getvalue())  # the same path, fixed: its new bytes are known already
        os.utime(damaged, ns=(time.time_ns(), time.time_ns() + 1_000_000))
        assert (await pool.check(str(damaged), limits, address)).width == 64
        damaged.write_bytes(good.getvalue()[:-41])  # and changed again: checked afresh
        os.utime(damaged, ns=(time.time_ns(), time.time_ns() + 2_000_000))
        with pytest.raises(UploadRejected):
            await pool.check(str(damaged), limits, address)
        assert len(decodes) == 3
        # Another address checks the same bytes itself: a remembered verdict shared by everyone would answer it at
        # once, and tell it that someone had uploaded them.
        assert (await pool.check(str(fine), limits, "198.51.100.70")).width == 64
        assert len(decodes) == 4

    try:
        asyncio.run(scenario())
    finally:
        pool.close()


def test_a_picture_padded_with_megabytes_of_comments_is_stored_re_encoded():
    """A few addresses filled the whole picture store, so every new picture of everyone was refused for a day:
    1024x1024 JPEGs padded with 8 MB of comment segments passed every check and
    were stored, and charged, at 10 MB each."""
    limits = UploadLimits(10 << 20, 16_000_000, 1024, ("PNG", "JPEG", "WEBP"))
    buf = io.BytesIO()
    Image.effect_noise((1024, 1024), 60).convert("RGB").save(buf, format="JPEG", quality=95)
    honest = buf.getvalue()
    assert check_image(honest, limits).kept_original, "an ordinary photo is stored as uploaded"
    comment = b"\x00" * 65533
    segment = b"\xff\xfe" + (len(comment) + 2).to_bytes(2, "big") + comment
    padded = honest[:2] + segment * 128 + honest[2:]  # 8 MB of COM segments right after SOI
    assert len(padded) > 8_000_000
    checked = check_image(padded, limits)
    assert not checked.kept_original and checked.format == "JPEG" and (checked.width, checked.height) == (1024, 1024)
    assert len(checked.data) < 2 * 1024 * 1024, len(checked.data)


def test_a_photo_with_a_long_comment_that_must_be_downscaled_is_stored_without_it():
    """Pillow writes a JPEG's comment back when it saves; one over 64 KB (two COM segments) made the re-encode of
    a photo that had to be downscaled fail with an internal error instead of being stored."""
    limits = UploadLimits(10 << 20, 16_000_000, 1024, ("PNG", "JPEG", "WEBP"))
    buf = io.BytesIO()
    Image.new("RGB", (2048, 1536), (30, 90, 200)).save(buf, format="JPEG")
    photo = buf.getvalue()
    segment = b"\xff\xfe" + (65533 + 2).to_bytes(2, "big") + b"x" * 65533
    checked = check_image(photo[:2] + segment * 2 + photo[2:], limits)
    assert checked.downscaled and (checked.width, checked.height) == (1024, 768)
    assert b"xxxx" not in checked.data


def test_waiting_for_an_address_slot_is_capped_per_address():
    """A reloaded page waits for its address's answer slot; a client making many page loads must not park an
    unbounded number of waiting events."""
    from ui.shared.address_slots import AddressSlots, SlotRefused

    slots = AddressSlots(1, "busy", max_waiting=2)

    async def scenario():
        slots.acquire("203.0.113.7")
        waiters = [asyncio.ensure_future(slots.acquire_within("203.0.113.7", 5)) for _ in range(2)]
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(SlotRefused):
            await slots.acquire_within("203.0.113.7", 5)  # a third waiter is refused at once
        assert time.monotonic() - started < 0.5
        await slots.acquire_within("198.51.100.7", 5)  # another address is not affected
        slots.release("203.0.113.7")
        await asyncio.wait_for(asyncio.gather(*waiters, return_exceptions=True), timeout=10)
        assert sum(w.exception() is None for w in waiters) == 1, "the freed slot went to one waiter"

    asyncio.run(scenario())
