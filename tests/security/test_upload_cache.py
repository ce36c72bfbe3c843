"""What one upload may leave in Gradio's upload cache (ui.uploads.cache_dirs): one file per request, every upload
charged at least a minimum of its address's byte budget, and empty directories swept.

Gradio's own route takes up to 1,000 files a request, one directory per distinct file, and its cleaner never
removes those directories: tiny distinct files were a way to use up the disk's inodes within the byte budget."""
from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import httpx
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.uploads.cache_dirs import MIN_UPLOAD_CHARGE_BYTES, EmptyDirSweeper, sweep_empty_dirs

pytestmark = pytest.mark.timeout(180)


def upload_folder() -> Path:
    from gradio.utils import get_upload_folder

    return Path(get_upload_folder())


def loose_files(folder: Path) -> set[str]:
    """Plain files directly in the upload folder: Gradio's temporary files of uploads still being parsed."""
    return {e.name for e in os.scandir(folder) if e.is_file()} if folder.is_dir() else set()


def test_an_upload_of_two_files_is_refused_and_leaves_nothing_on_disk():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upcache"))
        with launched_page(config) as (url, _client):
            folder = upload_folder()
            before = loose_files(folder)
            first, second = os.urandom(2000), os.urandom(2000)
            response = httpx.post(url + "gradio_api/upload", timeout=30,
                                  files=[("files", ("a.png", first)), ("files", ("b.png", second))])
            assert response.status_code == 400 and "Too many files" in response.text, response.text[:200]
            for content in (first, second):
                assert not (folder / hashlib.sha256(content).hexdigest()).exists(), "no directory is left"
            assert loose_files(folder) <= before, "the parts already written are deleted"
            single = httpx.post(url + "gradio_api/upload", files={"files": ("c.png", os.urandom(2000))}, timeout=30)
            assert single.status_code == 200 and len(single.json()) == 1, "one file per upload still works"
            assert httpx.get(url + "gradio_api/info", timeout=10).status_code == 200, "the page keeps serving"


def test_tiny_uploads_are_each_charged_the_minimum_so_one_address_cannot_make_millions_of_files():
    budget = 8 * MIN_UPLOAD_CHARGE_BYTES
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upcache"),
                          max_upload_bytes=budget, address_upload_bytes=budget)
        with launched_page(config) as (url, _client):
            codes = [httpx.post(url + "gradio_api/upload", files={"files": (f"t{i}.png", os.urandom(100))},
                                timeout=30).status_code for i in range(9)]
            assert codes == [200] * 8 + [429], "100-byte uploads count as the minimum each: 8 fit, not 5,000"


def test_the_sweep_removes_only_empty_directories_old_enough(tmp_path):
    now = time.time()
    old_empty, new_empty, old_full = tmp_path / "old-empty", tmp_path / "new-empty", tmp_path / "old-full"
    for folder in (old_empty, new_empty, old_full):
        folder.mkdir()
    (old_full / "picture.png").write_bytes(b"x")
    (tmp_path / "loose-file").write_bytes(b"x")
    for path in (old_empty, old_full):
        os.utime(path, (now - 600, now - 600))
    assert sweep_empty_dirs(tmp_path, min_age_s=60, now=now) == 1
    assert not old_empty.exists()
    assert new_empty.is_dir(), "a directory just made for an upload in progress is kept"
    assert (old_full / "picture.png").exists() and (tmp_path / "loose-file").exists()
    assert sweep_empty_dirs(tmp_path / "missing", min_age_s=0) == 0


def test_the_sweeper_thread_keeps_sweeping(tmp_path):
    sweeper = EmptyDirSweeper(tmp_path, interval_s=0.05, min_age_s=0).start()
    try:
        (tmp_path / "gone-file-dir").mkdir()
        deadline = time.monotonic() + 10
        while (tmp_path / "gone-file-dir").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not (tmp_path / "gone-file-dir").exists()
        (tmp_path / "another").mkdir()
        while ((tmp_path / "another").exists() or sweeper.removed < 2) and time.monotonic() < deadline:
            time.sleep(0.05)  # the count goes up just after the directory goes
        assert not (tmp_path / "another").exists() and sweeper.removed == 2
    finally:
        sweeper.stop()
