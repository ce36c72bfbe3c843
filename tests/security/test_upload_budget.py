"""Upload byte budgets: one address cannot fill the page's disk with uploads (ui.uploads.budget).

Each upload is capped by size, but before these budgets nothing capped how many: a client posting random
10 MB files as fast as it could would have filled Gradio's upload cache, on disk until the hourly cleaning."""
from __future__ import annotations

import os
import time
from pathlib import Path

import httpx
import pytest

from tests.fake_clock import FakeClock
from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.uploads.budget import UploadLedger

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
                          clock=clock, address_share=1.0)
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


def test_no_address_takes_more_than_its_share_of_the_page_budget():
    """Three addresses uploading at their short-window limit kept the page's budget spent: each address may now
    hold at most an eighth of the page's budget over the page's window."""
    clock = FakeClock()
    ledger = UploadLedger(address_bytes=10 * MB, address_window_s=60, total_bytes=80 * MB, total_window_s=600,
                          clock=clock)
    assert ledger.address_share_bytes == 10 * MB
    refused, first = ledger.charge_with_receipt("a", 6 * MB)
    assert refused is None
    clock.now += 61  # the short window has passed; the page's has not
    which, wait = ledger.charge("a", 6 * MB)
    assert which == "share" and wait == pytest.approx(539), "the first upload leaves the page's window in 539 s"
    assert ledger.charge("b", 6 * MB) is None, "another address has its own share"
    ledger.refund(first, 3 * MB)
    assert ledger.charge("a", 6 * MB) is None, "a refund gives the share back too"
    clock.now += 600
    assert ledger.charge("a", 10 * MB) is None, "all left the page's window"
    assert set(ledger._share_sums) == {"a"}, "addresses whose bytes all left the window are forgotten"


def test_ledger_refund_gives_back_both_windows():
    clock = FakeClock()
    ledger = UploadLedger(address_bytes=10 * MB, address_window_s=60, total_bytes=12 * MB, total_window_s=600,
                          clock=clock, address_share=1.0)
    refused, first = ledger.charge_with_receipt("a", 9 * MB)
    assert refused is None
    refused, second = ledger.charge_with_receipt("a", 1 * MB)  # charged before the first one's refund comes
    assert refused is None and ledger.charge("a", 2 * MB)[0] == "address"
    ledger.refund(first, 8 * MB)  # 8 of the first's 9 MB never arrived: its own charge shrinks, not the latest
    assert first.spent == 1 * MB and second.spent == 1 * MB
    assert ledger.charge("a", 2 * MB) is None
    assert ledger.charge("b", 8 * MB) is None, "the page's window got the bytes back too"
    assert ledger.charge("c", 1 * MB)[0] == "page"
    ledger.refund(second, 5 * MB)  # no more than was charged comes back
    assert second.spent == 0
    assert ledger.charge("c", 1 * MB) is None and ledger.charge("c", 1 * MB)[0] == "page"
    clock.now += 601  # both windows passed: a late refund changes nothing
    ledger.refund(first, 1 * MB)
    assert ledger.charge("d", 10 * MB) is None


def test_declaring_big_uploads_and_sending_nothing_does_not_spend_the_budget():
    """A client that declares an 1.9 MB upload, sends no body and hangs up, again and again: before, each try cost
    its declared size, so a dozen of them (no bandwidth) locked the address, and a few addresses the whole page,
    out of uploads."""
    import socket
    from urllib.parse import urlparse

    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upbudget"),
                          max_upload_bytes=2 * MB, address_upload_bytes=5 * MB)
        with launched_page(config) as (url, _client):
            host = urlparse(url)
            for _ in range(8):  # 15 MB declared in all, three times the address budget
                with socket.create_connection((host.hostname, host.port), timeout=10) as sock:
                    sock.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\n"
                                 b"Content-Type: multipart/form-data; boundary=b\r\n"
                                 + f"Content-Length: {int(1.9 * MB)}\r\n\r\n".encode())
                    sock.shutdown(socket.SHUT_WR)
                    sock.recv(4096)  # whatever Gradio answers, or the close
            time.sleep(1.0)  # the page gives the budget back when it has seen the hang-up, a moment after the close
            # each hang-up still cost the minimum charge (64 KiB: 0.5 MB in all), not its 1.9 MB
            accepted = [random_upload(url, int(1.2 * MB), f"n{i}.png") for i in range(3)]
            assert [r.status_code for r in accepted] == [200, 200, 200], [r.text[:100] for r in accepted]
            assert random_upload(url, int(1.2 * MB)).status_code == 429, "real bytes still count"


def test_uploads_held_open_cannot_hold_the_page_budget_from_one_address():
    """Twelve addresses each declaring three 10 MB uploads and sending a kilobyte held
    a 256 MiB page budget for the two minutes a body may take, at no cost, and every other upload then had to
    evict someone's picture. An address may now have four uploads arriving at once."""
    import socket
    from urllib.parse import urlparse

    from tests.security.attack import http
    from ui.uploads.budget import ARRIVING_REFUSAL

    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upbudget"),
                          max_upload_bytes=2 * MB, trusted_proxies=("127.0.0.1",))
        with launched_page(config) as (url, _client):
            host = urlparse(url)
            held = []
            try:
                for _ in range(4):
                    sock = socket.create_connection((host.hostname, host.port), timeout=10)
                    sock.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 203.0.113.5\r\n"
                                 b"Content-Type: multipart/form-data; boundary=b\r\n"
                                 + f"Content-Length: {int(1.9 * MB)}\r\n\r\n".encode() + b"--b\r\n")
                    held.append(sock)
                time.sleep(0.5)
                with http(forwarded="203.0.113.5") as client:
                    refused = client.post(url + "gradio_api/upload", files={"files": ("a.png", os.urandom(1000))})
                assert refused.status_code == 429 and refused.text == ARRIVING_REFUSAL
                with http(forwarded="198.51.100.5") as client:
                    assert client.post(url + "gradio_api/upload",
                                       files={"files": ("a.png", os.urandom(1000))}).status_code == 200
            finally:
                for sock in held:
                    sock.close()
            time.sleep(1.0)  # the page sees the hang-ups
            with http(forwarded="203.0.113.5") as client:
                assert client.post(url + "gradio_api/upload",
                                   files={"files": ("a.png", os.urandom(1000))}).status_code == 200


def test_a_page_budget_held_by_uploads_still_arriving_says_to_come_back_when_they_end():
    """Held-open uploads fill the page's budget for at most the upload timeout: a visitor refused meanwhile was told
    to come back in two hours (Retry-After 7193), now in the upload timeout at most."""
    import socket
    from urllib.parse import urlparse

    from tests.security.attack import http

    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("upbudget"),
                          max_upload_bytes=2 * MB, address_upload_bytes=2 * MB, upload_cache_max_bytes=16 * MB,
                          upload_timeout_s=60, trusted_proxies=("127.0.0.1",))
        with launched_page(config) as (url, _client):
            host = urlparse(url)
            held = []
            try:
                for i in range(8):  # each address may take an eighth of the page's budget: 2 MB
                    sock = socket.create_connection((host.hostname, host.port), timeout=10)
                    sock.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\n"
                                 + f"X-Forwarded-For: 203.0.113.{40 + i}\r\n".encode()
                                 + b"Content-Type: multipart/form-data; boundary=b\r\n"
                                 + f"Content-Length: {int(1.95 * MB)}\r\n\r\n".encode() + b"--b\r\n")
                    held.append(sock)
                time.sleep(0.5)
                with http(forwarded="198.51.100.40") as client:
                    refused = client.post(url + "gradio_api/upload",
                                          files={"files": ("a.png", os.urandom(int(1.5 * MB)))})
                assert refused.status_code == 429 and refused.text.startswith("The page is receiving too many")
                assert 1 <= int(refused.headers["retry-after"]) <= 60, refused.headers["retry-after"]
            finally:
                for sock in held:
                    sock.close()
            time.sleep(1.0)
            with http(forwarded="198.51.100.40") as client:
                assert client.post(url + "gradio_api/upload",
                                   files={"files": ("a.png", os.urandom(int(1.5 * MB)))}).status_code == 200
