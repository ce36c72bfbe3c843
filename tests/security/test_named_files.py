"""A call that names a file instead of uploading one: a URL the page would download, or another client's upload found by
its bytes' folder (ui.gradio_adapters.named_files). Both are refused before Gradio converts anything, with one sentence
for every case, so the refusal says nothing about what exists."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.security.attack import (Event, assert_can_still_ask, call, cancel_jobs, http, identity,
                                   uploaded_by_both)
from ui.shared import wording

pytestmark = pytest.mark.timeout(180)

VICTIM, STRANGER = "198.51.100.17", "203.0.113.19"
FILE_META = {"_type": "gradio.FileData"}


def refusal(url: str, address: str, token: str, path) -> str:
    """The sentence a /chat naming ``path`` is refused with (fails the test if it was admitted)."""
    with http(forwarded=address) as client, pytest.raises(RuntimeError, match="the page failed the event") as refused:
        call(client, url, "chat", [{"text": "what colour is it?",
                                    "files": [{"path": path, "meta": FILE_META}]}, 16, token])
    return str(refused.value)


def admitted(url: str, address: str, token: str, path: str) -> bool:
    event = Event(url, "chat", [{"text": "what colour is it?", "files": [{"path": path, "meta": FILE_META}]}, 16,
                                token], forwarded=address)
    try:
        return event.status().startswith(wording.WAITING_STARTS)
    finally:
        event.done.wait(0)


class CountingServer:
    """An HTTP server that counts requests and serves a big "picture": a stand-in for an attacker's web host."""

    def __init__(self):
        hits = self.hits = []

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                hits.append(self.path)
                body = b"\x89PNG" + b"0" * 4_000_000
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/cat.png"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_a_url_is_never_downloaded(quiet_page, monkeypatch):
    import safehttpx

    async def resolves_publicly(hostname):  # the loopback server stands in for a public host
        return "127.0.0.1"
    monkeypatch.setattr(safehttpx, "async_validate_url", resolves_publicly)
    url, owlet = quiet_page
    host = CountingServer()
    try:
        with http(forwarded=STRANGER) as client:
            token = identity(client, url)
        for named in (host.url, host.url.upper().replace("HTTP://", "http://"), "data:image/png;base64,iVBORw0KGgo="):
            message = refusal(url, STRANGER, token, named)
            assert "must be uploaded to this page first" in message, message
        assert host.hits == [], f"the page fetched {host.hits}"
    finally:
        host.close()
    assert owlet.queue_stats()["queued"] == 0, "nothing was admitted"
    assert_can_still_ask(url, owlet, token, forwarded=STRANGER)


def test_another_clients_upload_cannot_be_named(quiet_page):
    url, owlet = quiet_page
    _data, victims, probe, folder = uploaded_by_both(url, VICTIM, STRANGER, "probe.png")
    with http(forwarded=STRANGER) as client:
        stranger = identity(client, url)
    with http(forwarded=VICTIM) as client:
        victim = identity(client, url)
    try:
        taken = refusal(url, STRANGER, stranger, victims)
        missing = refusal(url, STRANGER, stranger, f"{folder}/never-uploaded.png")
        directory = refusal(url, STRANGER, stranger, folder)
        assert taken == missing == directory, "the refusal tells an upload apart from no file"
        assert "must be uploaded to this page first" in taken
        assert owlet.queue_stats()["queued"] == 0, "nothing was admitted"
        many = {"text": "what colour is it?", "files": [{"path": probe, "meta": FILE_META}] * 5}
        with http(forwarded=STRANGER) as client, pytest.raises(RuntimeError, match="must be uploaded"):
            call(client, url, "chat", [many, 16, stranger])  # five of its own: more than a message holds
        assert admitted(url, STRANGER, stranger, probe), "the stranger may send its own upload"
        assert admitted(url, VICTIM, victim, victims), "and the victim its own"
    finally:
        cancel_jobs(owlet)
