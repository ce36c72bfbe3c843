"""Oversized request bodies: refused unread with 413, so no client can make the page hold and parse
hundreds of megabytes of JSON on the event loop that streams everyone's answers (ui.edge.body_limits)."""
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


def test_an_upload_over_the_upload_limit_is_refused_as_it_arrives(page):
    """Gradio's own size limit is off for the page (its front end dropped a bigger picture and sent the question
    without it); the upload route refuses a file over OWLET_UI_MAX_UPLOAD_BYTES itself, before writing it."""
    limit = UIConfig().max_upload_bytes
    response = httpx.post(page + "gradio_api/upload", files={"files": ("big.png", b"\x89PNG" + b"0" * limit)},
                          timeout=60)
    assert response.status_code == 413, response.text[:200]
    assert still_serving(page)


def test_the_default_limit_holds_the_longest_question_and_little_more():
    """The default is sized to the page's longest question (4,000 emoji, JSON-escaped: 12 bytes each), not to a
    megabyte: parsing a body costs the page's event loop in proportion to its size."""
    config = UIConfig()
    longest = join_body("😀" * config.max_text_chars)
    assert len(longest) < config.max_request_bytes <= 2 * len(longest) + 16 * 1024, (len(longest),
                                                                                       config.max_request_bytes)


@pytest.mark.parametrize("path", ["gradio_api/queue/join", "gradio_api/call/chat", "gradio_api/run/predict"])
def test_a_deeply_nested_body_gets_a_sentence_not_a_server_error(page, path):
    """2 KB of nested lists made Python's JSON parser raise RecursionError inside Gradio: 500 and a traceback per
    request."""
    deep = b'{"data": ' + b"[" * 2000 + b"]" * 2000 + b', "session_hash": "deepbody"}'
    not_deep_enough_to_fail_python = b'{"data": ' + b"[" * 100 + b"]" * 100 + b', "session_hash": "deepbody"}'
    for body in (deep, not_deep_enough_to_fail_python, b"[1, 2]", b"not json"):
        response = httpx.post(page + path, content=body, headers={"Content-Type": "application/json"}, timeout=30)
        assert response.status_code == 400 and "must be a JSON object" in response.text, (path, response.text[:200])
    assert still_serving(page)


@pytest.fixture
def parses(monkeypatch) -> list:
    """One entry per JSON parse the page's middlewares make (ui.edge.request_body)."""
    import ui.edge.request_body

    counted = []
    real_loads = json.loads

    class CountingJson:
        @staticmethod
        def loads(*args, **kwargs):
            counted.append(1)
            return real_loads(*args, **kwargs)
    monkeypatch.setattr(ui.edge.request_body, "json", CountingJson)
    return counted


def test_a_body_is_parsed_once_before_gradio(page, parses):
    """Every middleware that reads the body shares one parse (ui.edge.request_body.json_object); each used to parse
    it again, four times a request before Gradio's own."""
    response = httpx.post(page + "gradio_api/queue/join", content=join_body("how many shapes?"),
                          headers={"Content-Type": "application/json"}, timeout=30)
    assert response.status_code == 200, response.text[:200]
    assert len(parses) == 1, f"the body was parsed {len(parses)} times by the page's middlewares"


def test_a_body_of_many_small_lists_is_refused_before_it_is_parsed(page, parses):
    """96 KB of "[[[...]]]" nested 61 deep (under the depth limit) made 48k containers: 20-190 ms of the event loop
    a request, garbage collections included. Past MAX_JSON_CONTAINERS brackets the
    body is refused from a count of its bytes, never parsed."""
    from ui.edge.request_body import MAX_JSON_CONTAINERS

    nest = "[" * 60 + "]" * 60
    body = ('{"data": [' + ",".join([nest] * 790) + '], "fn_index": 1, "session_hash": "manylists"}').encode()
    assert len(body) < LIMIT and body.count(b"[") > MAX_JSON_CONTAINERS
    response = httpx.post(page + "gradio_api/queue/join", content=body, headers={"Content-Type": "application/json"},
                          timeout=30)
    assert response.status_code == 400 and "must be a JSON object" in response.text
    assert parses == [], "refused unparsed"
    question = join_body("[" * 4000)  # a question of brackets is still a question
    assert httpx.post(page + "gradio_api/queue/join", content=question, headers={"Content-Type": "application/json"},
                      timeout=30).status_code == 200
