"""Oversized request bodies: refused unread with 413, so no client can make the page hold and parse
hundreds of megabytes of JSON on the event loop that streams everyone's answers (ui.body_limits)."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig

pytestmark = pytest.mark.timeout(180)

LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def page():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("bodies"),
                          max_request_bytes=LIMIT)
        with launched_page(config) as (url, _client):
            yield url


def join_body(text: str) -> bytes:
    """A queue/join request as the browser sends it, for /chat, with a question of ``text``."""
    return json.dumps({"data": [{"text": text, "files": []}, 16, "no-token"], "event_data": None,
                       "fn_index": 0, "trigger_id": None, "session_hash": "bodies"}).encode()


def still_serving(url: str) -> bool:
    return httpx.get(url + "gradio_api/info", timeout=10).status_code == 200


def test_a_declared_oversized_body_is_refused_unread(page):
    body = join_body("x" * (4 * LIMIT))
    started = time.monotonic()
    response = httpx.post(page + "gradio_api/queue/join", content=body,
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413, response.text[:200]
    assert time.monotonic() - started < 10
    assert still_serving(page)


def test_a_chunked_oversized_body_is_cut_off(page):
    def chunks():  # no Content-Length: the page counts what arrives
        for _ in range(64):
            yield b"x" * (64 * 1024)

    try:
        response = httpx.post(page + "gradio_api/queue/join", content=chunks(),
                              headers={"Content-Type": "application/json"}, timeout=30)
        assert response.status_code == 413, response.text[:200]
    except httpx.RemoteProtocolError:
        pass  # the server answered 413 and closed before the client finished sending: also refused
    assert still_serving(page)


@pytest.mark.parametrize("path", ["gradio_api/call/chat", "gradio_api/run/predict"])
def test_other_json_routes_are_capped_too(page, path):
    response = httpx.post(page + path, content=b'{"data": ["' + b"x" * (2 * LIMIT) + b'"]}',
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 413, (path, response.status_code)


def test_a_request_under_the_limit_reaches_gradio(page):
    """A question of the page's longest allowed length fits with room to spare; Gradio answers it."""
    response = httpx.post(page + "gradio_api/queue/join", content=join_body("é" * 4000),
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 200, response.text[:200]


def test_uploads_keep_their_own_larger_limit(page):
    """An upload bigger than the request limit but within the upload limit is kept (Gradio then applies
    max_file_size per file)."""
    payload = b"\x89PNG" + b"0" * (2 * LIMIT)
    response = httpx.post(page + "gradio_api/upload", files={"files": ("big.png", payload)}, timeout=30)
    assert response.status_code == 200, response.text[:200]
