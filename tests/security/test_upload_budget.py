"""Upload byte budgets: one address cannot fill the page's disk with uploads (ui.upload_budget).

Each upload is capped by size, but before these budgets nothing capped how many: a client posting random
10 MB files as fast as it could would have filled Gradio's upload cache, on disk until the hourly cleaning."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from tests.fake_clock import FakeClock
from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.upload_budget import UploadLedger

pytestmark = pytest.mark.timeout(180)

MB = 1024 * 1024


def test_ledger_refuses_past_an_address_budget_and_frees_it_as_the_window_slides():
    clock = FakeClock()
    ledger = UploadLedger(address_bytes=10 * MB, address_window_s=60, total_bytes=100 * MB, total_window_s=600,
                          clock=clock)
    assert ledger.charge("a", 4 * MB) is None
    clock.now += 10
    assert ledger.charge("a", 4 * MB) is None
    which, wait = ledger.charge("a", 4 * MB)
    assert which == "address" and wait == pytest.approx(50), "the first upload leaves the window in 50 s"
    assert ledger.charge("b", 4 * MB) is None, "another address has its own budget"
    clock.now += 50
    assert ledger.charge("a", 4 * MB) is None, "the first upload left the window"


def test_ledger_page_budget_binds_across_addresses_and_a_refusal_records_nothing():
    clock = FakeClock()
    ledger = UploadLedger(address_bytes=10 * MB, address_window_s=60, total_bytes=20 * MB, total_window_s=600,
                          clock=clock)
    for address in ("a", "b"):
        assert ledger.charge(address, 10 * MB) is None
    which, wait = ledger.charge("c", 1 * MB)
    assert which == "page" and wait == pytest.approx(600)
    clock.now += 60  # the per-address windows have passed, the page's has not
    assert ledger.charge("a", 1 * MB)[0] == "page"
    clock.now += 541
    assert ledger.charge("c", 10 * MB) is None


def random_upload(url: str, size: int, name: str = "noise.png") -> httpx.Response:
    return httpx.post(url + "gradio_api/upload", files={"files": (name, os.urandom(size))}, timeout=60)


def test_one_address_flooding_uploads_is_stopped_at_its_budget_with_a_sentence():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upbudget"),
                          max_upload_bytes=2 * MB, address_upload_bytes=5 * MB)
        with launched_page(config) as (url, _client):
            accepted = [random_upload(url, int(1.5 * MB), f"n{i}.png") for i in range(3)]
            assert [r.status_code for r in accepted] == [200, 200, 200], [r.text[:100] for r in accepted]
            refused = random_upload(url, int(1.5 * MB))
            assert refused.status_code == 429
            assert refused.text.startswith("Upload limit reached: at most 5 MB of images per 10 min")
            assert 1 <= int(refused.headers["retry-after"]) <= 600
            kept = [Path(p) for r in accepted for p in r.json()]
            assert all(p.exists() for p in kept), "what was accepted is kept"
            assert httpx.get(url + "gradio_api/info", timeout=10).status_code == 200, "the page keeps serving"


def test_an_upload_without_a_declared_length_is_refused():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upbudget"))
        with launched_page(config) as (url, _client):
            boundary = "owlet"
            body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.png\"\r\n"
                    f"Content-Type: image/png\r\n\r\n").encode() + b"x" * 1000 + f"\r\n--{boundary}--\r\n".encode()

            def chunks():  # no Content-Length: transfer-encoding chunked
                yield body

            response = httpx.post(url + "gradio_api/upload", content=chunks(), timeout=30,
                                  headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
            assert response.status_code == 411 and "Content-Length" in response.text
