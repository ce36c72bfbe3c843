"""Filling the page's upload budget, so nobody else can upload a picture for hours.

Two floods, each address within its own limits: 33 addresses uploaded random 10 MB files for
15 s; 40 addresses uploaded padded 10 MB JPEGs and asked a one-token question about each (so they were "used").
Either way every upload over a few MB then got 429 for two hours. Now, when the page's budget is full, stored
uploads are deleted to make room: the oldest file of the address holding the most, unused before used
(ui.uploads.room)."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.fake_clock import FakeClock
from tests.security.attack import Event, cancel_jobs, http, identity, private_picture, upload
from tests.security.pages import page_without_worker
from ui.shared import wording
from ui.uploads.budget import UploadLedger
from ui.uploads.owners import UploadedPaths
from ui.uploads.room import UploadRoom

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024
FILE_META = {"_type": "gradio.FileData"}


class Page:
    """A ledger, its owners and its upload room over a real folder, as the page wires them."""

    def __init__(self, folder: Path, total_bytes: int = 10 * MB, window_s: float = 600):
        self.folder, self.clock = folder, FakeClock()
        self.ledger = UploadLedger(address_bytes=100 * MB, address_window_s=60, total_bytes=total_bytes,
                                   total_window_s=window_s, clock=self.clock, address_share=1.0)
        self.owners = UploadedPaths()
        self.room = UploadRoom(self.ledger, self.owners, str(folder), clock=self.clock)

    def upload(self, address: str, size: int, name: str | None = None) -> Path | None:
        """Charge, store and record an upload as the middlewares do; None if the budget refused it."""
        refused, charge = self.ledger.charge_with_receipt(address, size)
        if refused is not None and refused[0] == "page" and self.room.make_room(size):
            refused, charge = self.ledger.charge_with_receipt(address, size)
        if refused is not None:
            return None
        path = self.folder / (name or os.urandom(8).hex()) / "upload.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x")
        self.owners.record(address, str(path))
        self.room.claim(address, str(path), charge)
        return path


def test_a_full_budget_deletes_the_biggest_holders_oldest_upload_first(tmp_path):
    page = Page(tmp_path)
    visitor = page.upload("visitor", 1 * MB)  # uploaded, question not sent yet
    asked = page.upload("asker", 2 * MB)
    page.room.mark_used(str(asked), "asker")  # a turn was admitted with it
    flood = [page.upload("flooder", 1 * MB) for _ in range(4)]
    other = [page.upload("other", 1 * MB) for _ in range(3)]
    assert page.ledger.page_room() == 0
    newcomer = page.upload("newcomer", 2 * MB)
    assert newcomer is not None, "room was made"
    assert [p.exists() for p in flood] == [False, False, True, True], "the biggest holder's oldest went"
    assert visitor.exists() and asked.exists() and all(p.exists() for p in other)
    assert page.owners.owners(str(flood[0])) is None, "a deleted upload is nobody's: not served, not nameable"
    assert page.room.held_bytes("flooder") == 2 * MB and page.room.deleted_files == 2
    # held now: other 3 MB, flooder 2, asker 2 (used), newcomer 2, visitor 1: the next 3 MB come from the big ones
    assert page.upload("newcomer", 3 * MB) is not None
    assert visitor.exists() and asked.exists(), "an address holding less than the others keeps its files"
    assert page.room.deleted_files == 5


def test_files_marked_used_still_give_way_when_their_address_holds_the_most(tmp_path):
    """The second flood's pin: every flood file asked about once (a one-token question), so none was "unused",
    and the one unused file left, a visitor's waiting picture, was deleted for each newcomer."""
    page = Page(tmp_path)
    waiting = page.upload("visitor", 1 * MB)
    pinned = []
    for address in ("a1", "a2", "a3"):
        for _ in range(3):
            pinned.append(page.upload(address, 1 * MB))
            page.room.mark_used(str(pinned[-1]), address)
    assert page.ledger.page_room() == 0
    assert page.upload("newcomer", 2 * MB) is not None
    assert waiting.exists(), "the visitor holds least: its waiting picture stays"
    assert sum(not p.exists() for p in pinned) == 2, "two of the pinned files gave way"
    assert page.room.held_bytes("visitor") == 1 * MB


def test_an_address_gives_up_its_unused_files_before_its_used_ones(tmp_path):
    page = Page(tmp_path, total_bytes=4 * MB)
    asked = page.upload("visitor", 1 * MB)
    page.room.mark_used(str(asked), "visitor")
    spare = [page.upload("visitor", 1 * MB) for _ in range(3)]
    assert page.upload("newcomer", 1 * MB) is not None
    assert asked.exists() and not spare[0].exists() and spare[1].exists()


def test_what_an_address_spent_stays_spent_when_its_files_are_deleted(tmp_path):
    page = Page(tmp_path)
    page.ledger.address_bytes = 6 * MB
    for _ in range(6):
        assert page.upload("flooder", 1 * MB) is not None
    for _ in range(4):
        assert page.upload("other", 1 * MB) is not None
    assert page.upload("newcomer", 3 * MB) is not None
    assert page.room.held_bytes("flooder") == 3 * MB
    assert page.ledger.charge("flooder", 1 * MB)[0] == "address", "the flood cannot simply start again"


def test_nothing_is_deleted_when_deleting_cannot_make_the_upload_fit(tmp_path):
    page = Page(tmp_path)
    assert page.ledger.charge("uploading", 8 * MB) is None  # an upload on its way in: charged, no file yet
    waiting = page.upload("visitor", 1 * MB)
    assert page.upload("newcomer", 3 * MB) is None, "only 2 MB could be had: refused as before"
    assert waiting.exists() and page.room.deleted_files == 0
    assert page.upload("newcomer", 2 * MB) is not None and not waiting.exists()


def test_a_picture_uploaded_again_by_its_uploader_holds_the_page_budget_once(tmp_path):
    page = Page(tmp_path)
    for _ in range(5):
        picture = page.upload("visitor", 2 * MB, name="picture")
    assert page.ledger.page_room() == 8 * MB and page.room.held_bytes("visitor") == 2 * MB
    assert page.ledger.charge("visitor", 99 * MB)[0] == "address", "each upload was still spent"
    assert picture.exists()


def test_one_picture_uploaded_again_from_many_addresses_pins_nothing(tmp_path):
    """One picture, asked about once, uploaded again from nine addresses held the
    page's budget 25 times over, and a visitor's waiting picture was deleted for it. Now each copy is its
    uploader's claim and gives way as theirs."""
    page = Page(tmp_path)
    pinned = page.upload("asker", 2 * MB, name="pinned")
    page.room.mark_used(str(pinned), "asker")
    waiting = page.upload("visitor", 1 * MB)
    for address in (f"203.0.113.{i}" for i in range(1, 9)):
        assert page.upload(address, 2 * MB, name="pinned") == pinned
    assert waiting.exists(), "the visitor holds least: its picture stayed"
    assert pinned.exists() and page.room.deleted_files == 0, "still claimed by the last uploaders"
    assert page.upload("newcomer", 7 * MB) is not None
    assert waiting.exists()


def test_uploading_someones_picture_again_neither_deletes_theirs_nor_counts_it_twice_for_them(tmp_path):
    page = Page(tmp_path, total_bytes=4 * MB)
    shared = page.upload("victim", 1 * MB, name="same-bytes")
    assert page.upload("stranger", 1 * MB, name="same-bytes") == shared
    extra = page.upload("stranger", 2 * MB)
    assert page.room.held_bytes("victim") == 1 * MB and page.room.held_bytes("stranger") == 3 * MB
    assert page.upload("newcomer", 2 * MB) is not None  # the stranger gives up its claim on the shared file first
    assert shared.exists() and not extra.exists()
    assert page.owners.owners(str(shared)) == {"victim"}, "the stranger lost it, the victim kept it"
    assert page.upload("newcomer2", 4 * MB) is not None  # the whole budget: every claim goes, the last one deletes
    assert not shared.exists() and page.owners.owners(str(shared)) is None


def test_an_upload_used_once_is_still_used_when_uploaded_again(tmp_path):
    page = Page(tmp_path, total_bytes=4 * MB)
    first = page.upload("visitor", 1 * MB, name="picture")
    page.room.mark_used(str(first), "visitor")
    spare = page.upload("visitor", 1 * MB)
    assert page.upload("visitor", 1 * MB, name="picture") == first  # the same picture sent again later
    page.upload("flooder", 2 * MB)
    assert page.upload("newcomer", 1 * MB) is not None
    assert first.exists() and not spare.exists(), "its address's unused file went first"


def test_whether_someone_asked_about_a_picture_does_not_change_how_anothers_copy_gives_way(tmp_path):
    """A claim, not a file, is marked used: were it the file, a stranger who uploaded a victim's picture again would
    get a used claim if the victim had asked about it, and could tell by which of its own files went first."""
    page = Page(tmp_path)
    shared = page.upload("victim", 1 * MB, name="same-bytes")
    page.room.mark_used(str(shared), "victim")
    assert page.upload("stranger", 1 * MB, name="same-bytes") == shared
    own = page.upload("stranger", 1 * MB)
    page.upload("filler", 7 * MB)
    assert page.upload("newcomer", 2 * MB) is not None  # the filler (7 MB) gives up its file
    assert page.upload("newcomer", 6 * MB) is not None  # 1 MB short: the stranger (2 MB) gives up its oldest claim
    assert own.exists() and shared.exists(), "the stranger's claim on the copy went first, as an unused one"
    assert page.owners.owners(str(shared)) == {"victim"}


def test_charges_past_the_window_are_forgotten_and_nothing_outside_the_folder_is_deleted(tmp_path):
    folder = tmp_path / "uploads"
    folder.mkdir()
    page = Page(folder, total_bytes=2 * MB, window_s=100)
    outside = tmp_path / "not-an-upload.bin"
    outside.write_bytes(b"keep me")
    refused, charge = page.ledger.charge_with_receipt("odd", 1 * MB)
    page.room.claim("odd", str(outside), charge)
    assert page.upload("newcomer", 2 * MB) is not None
    assert outside.exists(), "only files in the upload folder are ever deleted"
    page.clock.now += 101
    assert page.room.held_bytes("newcomer") == 2 * MB
    assert page.ledger.page_room() == 2 * MB and page.room.make_room(1 * MB) == 0
    assert page.room.held_bytes("newcomer") == 0, "a charge out of the page's window holds nothing"


# ---- the page itself ------------------------------------------------------------------------------------------

VISITOR, ASKER, NEWCOMER = "198.51.100.7", "198.51.100.8", "198.51.100.9"
FLOODERS = [f"203.0.113.{i}" for i in range(1, 9)]


def ask(url: str, address: str, path: str) -> str:
    """Send a question with the upload at ``path`` as ``address``; its status line (a queued turn stays queued)."""
    with http(forwarded=address) as client:
        token = identity(client, url)
    event = Event(url, "chat", [{"text": "what is it?", "files": [{"path": path, "meta": FILE_META}]}, 16, token],
                  forwarded=address)
    try:
        return event.status()
    finally:
        event.done.wait(0)


def test_a_flood_of_unused_uploads_gives_way_to_a_visitors_picture():
    """Eight addresses fill the page's upload budget with random files no question ever names; a newcomer's
    picture is then accepted (before: 429 for two hours), the flood's oldest files deleted for it, and the
    waiting visitor's and the asker's pictures kept and usable."""
    with page_without_worker("upload-room", max_upload_bytes=2 * MB, address_upload_bytes=2 * MB,
                             upload_cache_max_bytes=16 * MB) as (url, owlet):
        try:
            waiting = upload(url, VISITOR, private_picture(), "waiting.png")
            asked = upload(url, ASKER, private_picture(), "asked.png")
            assert ask(url, ASKER, asked).startswith(wording.WAITING_STARTS)
            flood = [upload(url, address, os.urandom(int(1.9 * MB)), "noise.png") for address in FLOODERS]
            with http(forwarded=NEWCOMER) as client:
                answer = client.post(url + "gradio_api/upload",
                                     files={"files": ("photo.png", os.urandom(int(1.5 * MB)), "image/png")})
            assert answer.status_code == 200, answer.text
            assert not Path(flood[0]).exists(), "the flood's oldest upload made the room"
            assert all(Path(p).exists() for p in flood[1:])
            assert Path(waiting).exists() and Path(asked).exists()
            assert ask(url, VISITOR, waiting).startswith(wording.WAITING_STARTS), \
                "the waiting visitor's picture still works"
            with http(forwarded=ASKER) as client:
                assert client.get(url + f"gradio_api/file={asked}").status_code == 200, "shown in the asker's chat"
            with http(forwarded=FLOODERS[0]) as client:
                assert client.get(url + f"gradio_api/file={flood[0]}").status_code == 403
                again = client.post(url + "gradio_api/upload",
                                    files={"files": ("noise.png", os.urandom(int(1.9 * MB)), "image/png")})
            assert again.status_code == 429 and again.text.startswith("Upload limit reached"), \
                "what the flooder spent stays spent"
            assert httpx.get(url + "gradio_api/info", timeout=10).status_code == 200
        finally:
            cancel_jobs(owlet)


def noise_png(side: int) -> bytes:
    """A valid PNG that does not compress: about 3 bytes a pixel, so stored as uploaded."""
    import io

    from PIL import Image

    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG")
    return out.getvalue()


def test_a_flood_of_pictures_asked_about_once_still_gives_way():
    """The second flood's pin: each flood picture asked about once (admitted, so "used"). Before, only unused files
    could go, so the visitor's waiting picture was deleted and then uploads were refused for two hours; now the
    biggest holders' files go, and the visitor's picture stays."""
    with page_without_worker("upload-pin", max_upload_bytes=2 * MB, address_upload_bytes=2 * MB,
                             upload_cache_max_bytes=16 * MB) as (url, owlet):
        try:
            waiting = upload(url, VISITOR, private_picture(), "waiting.png")
            pinned = []
            for address in FLOODERS:
                pinned.append(upload(url, address, noise_png(800), "pin.png"))
                assert ask(url, address, pinned[-1]).startswith(wording.WAITING_STARTS)
            cancel_jobs(owlet)  # asked and cancelled at once: the files stay "used"
            with http(forwarded=NEWCOMER) as client:
                answer = client.post(url + "gradio_api/upload",
                                     files={"files": ("photo.png", noise_png(700), "image/png")})
            assert answer.status_code == 200, answer.text
            assert Path(waiting).exists(), "the visitor holds least: its picture stays"
            assert sum(not Path(p).exists() for p in pinned) == 1, "one pinned picture gave way"
            assert ask(url, VISITOR, waiting).startswith(wording.WAITING_STARTS)
            assert ask(url, NEWCOMER, answer.json()[0]).startswith(wording.WAITING_STARTS)
        finally:
            cancel_jobs(owlet)
