"""Requests whose content makes Gradio's API code raise: 400 and a sentence, not 500 and a traceback a call
(ui.request_errors). Found by a hostile audit, 2026-12-03."""
from __future__ import annotations

import logging

import httpx
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def page():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("errors"))
        with launched_page(config) as (url, _client):
            yield url


@pytest.mark.parametrize("method, path, body", [
    ("POST", "gradio_api/call/nope", {"data": []}),
    ("POST", "gradio_api/run/nope", {"data": []}),
    ("POST", "gradio_api/call/v2/nope", {}),
    ("POST", "gradio_api/call/v2/identity", {"stored_token": None, "session_hash": "abc"}),
])
def test_an_unknown_endpoint_or_argument_is_a_400_with_a_sentence(page, caplog, method, path, body):
    with caplog.at_level(logging.INFO):
        response = httpx.request(method, page + path, json=body, timeout=30)
    assert response.status_code == 400 and "/gradio_api/info" in response.text, (path, response.status_code,
                                                                               response.text[:200])
    assert not any(r.exc_info for r in caplog.records), "no traceback in the log"
    assert httpx.get(page + "gradio_api/info", timeout=10).status_code == 200


def test_an_upload_whose_field_is_not_a_file_is_a_400(page, caplog):
    with caplog.at_level(logging.INFO):
        response = httpx.post(page + "gradio_api/upload", data={"files": "not a file"}, timeout=30)
    assert response.status_code == 400, (response.status_code, response.text[:200])
    assert not any(r.exc_info for r in caplog.records)


def test_known_endpoints_still_answer(page):
    response = httpx.post(page + "gradio_api/call/identity", json={"data": [None]}, timeout=30)
    assert response.status_code == 200 and "event_id" in response.json()
