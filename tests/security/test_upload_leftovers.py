"""An upload that ends before it is stored leaves nothing behind: not its part on disk, not a charge on the page's
upload budget.

Gradio deleted what an upload had written only when its body was malformed. A client gone mid-upload left the part it
had sent in the upload folder, outside every budget's reach, until the cache's hourly cleaner: eight addresses each
abandoning a 1 MB upload held an 8 MB page budget full, and nobody could upload a picture. A full disk left its part
too, so the disk stayed full and every later picture, however small, failed, with a 400 telling the client its request
could not be read."""
from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from tests.deploy.services import host_tool
from tests.redis_server import running_redis, unique_prefix
from tests.security.attack import private_picture, upload
from tests.security.pages import page_without_worker
from tests.ui.stack import free_port
from ui.edge.request_errors import NO_ROOM

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024


def abandoned_upload(port: int, address: str, declared: int, sent: int) -> None:
    """An upload from ``address`` (through the trusted proxy) that declares ``declared`` bytes, sends ``sent`` of them
    and leaves."""
    head = (b'--b0undary\r\nContent-Disposition: form-data; name="files"; filename="big.png"\r\n'
            b"Content-Type: image/png\r\n\r\n")
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: page\r\nX-Forwarded-For: %s\r\n"
                     b"Content-Type: multipart/form-data; boundary=b0undary\r\nContent-Length: %d\r\n\r\n"
                     % (address.encode(), declared) + head + os.urandom(sent - len(head)))
        time.sleep(0.3)  # the page has read what was sent


def loose_files(folder: Path) -> set[str]:
    """Files lying in the upload folder itself: where Gradio's parser writes an upload as it arrives (a stored one is
    moved into a directory named by its bytes)."""
    return {p.name for p in folder.iterdir() if p.is_file()} if folder.is_dir() else set()


def test_uploads_abandoned_mid_body_leave_no_part_and_no_charge_on_the_pages_budget():
    from gradio.utils import get_upload_folder

    folder = Path(get_upload_folder())
    with page_without_worker("abandoned-uploads", max_upload_bytes=MB, address_upload_bytes=MB,
                             upload_cache_max_bytes=8 * MB) as (url, _owlet):
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        before = loose_files(folder)
        for i in range(8):  # each address its own budget's worth, the page's whole budget together
            abandoned_upload(port, f"198.51.100.{i + 1}", declared=MB - 1024, sent=MB - 64 * 1024)
        deadline = time.monotonic() + 10
        while loose_files(folder) - before and time.monotonic() < deadline:
            time.sleep(0.1)
        assert loose_files(folder) - before == set(), "an abandoned upload's part stayed on disk"
        # Another visitor's picture of the same size still fits in the page's budget.
        picture = private_picture() + os.urandom(MB - 128 * 1024)  # a PNG with bytes after it: a 0.9 MB upload
        assert upload(url, "198.51.100.100", picture, "visitor.png").endswith("visitor.png")


def test_a_full_disk_refuses_uploads_with_a_sentence_and_keeps_nothing_of_them(tmp_path):
    """The page runs with its upload folder on a 1 MiB filesystem of its own (a tmpfs in a mount namespace)."""
    unshare = host_tool("unshare", "/usr/bin/unshare")
    uploads = tmp_path / "uploads"
    uploads.mkdir()
    big = tmp_path / "big.png"
    Image.frombytes("RGB", (700, 700), random.randbytes(700 * 700 * 3)).save(big)  # 1.4 MB that will not compress
    assert big.stat().st_size > MB
    small = tmp_path / "small.png"
    small.write_bytes(private_picture())
    port = free_port()
    with running_redis() as redis_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OWLET_", "GRADIO_"))}
        env.update(REDIS_URL=redis_url, OWLET_KEY_PREFIX=unique_prefix("full-disk"), GRADIO_TEMP_DIR=str(uploads))
        page = subprocess.Popen(
            [unshare, "--mount", "--map-root-user", "sh", "-c",
             'mount -t tmpfs -o size=1m owlet-test "$1" && exec "$2" -m ui --port "$3"', "sh", str(uploads),
             sys.executable, str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}/"
            deadline = time.monotonic() + 120
            while True:
                assert page.poll() is None, page.stdout.read()[-3000:]
                assert time.monotonic() < deadline, "the page did not start"
                try:
                    if httpx.get(base + "healthz", timeout=2).status_code in (200, 503):
                        break
                except httpx.TransportError:
                    time.sleep(0.3)
            refused = httpx.post(base + "gradio_api/upload",
                                 files={"files": ("big.png", big.read_bytes(), "image/png")}, timeout=60)
            assert (refused.status_code, refused.text) == (503, NO_ROOM), (refused.status_code, refused.text)
            assert refused.headers.get("retry-after") == "60"
            with pytest.raises(AppError, match="no room to store pictures"):  # gradio_client reads the sentence too
                client = Client(base, verbose=False)
                client.predict({"text": "What is it?", "files": [handle_file(str(big))]}, 16,
                               client.predict(None, api_name="/identity"), api_name="/chat")
            # Nothing of the refused uploads stayed: a small picture fits.
            stored = httpx.post(base + "gradio_api/upload", files={"files": ("small.png", small.read_bytes(),
                                                                             "image/png")}, timeout=60)
            assert stored.status_code == 200 and stored.json()[0].endswith("small.png"), (stored.status_code,
                                                                                         stored.text)
        finally:
            page.terminate()
            output = page.communicate(timeout=30)[0]
    assert "the upload folder (GRADIO_TEMP_DIR) is full" in output, output[-3000:]
