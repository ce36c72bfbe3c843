"""Every refusal an API client can meet, as its status and OpenAI error object (``ui.api.errors``), and the edge's
plain-text refusals reshaped on ``/v1/`` paths only (``ui.edge.api_refusals``). No server needed."""
from __future__ import annotations

import asyncio
import json

import pytest
import redis

from ui.api.errors import ApiError, for_failed_answer, from_exception
from ui.edge.api_refusals import ApiErrors
from ui.shared.address_slots import SlotRefused
from ui.uploads.image_check import UploadRejected
from worker import errors


@pytest.mark.parametrize("exc, status, code", [
    (errors.InvalidInput("bad"), 400, "invalid_input"),
    (errors.UserCapReached(), 429, "identity_cap"),
    (errors.ClientBusy(), 429, "address_cap"),
    (errors.RateLimited(), 429, "turn_rate_limited"),
    (errors.QuotaExceeded(), 429, "image_quota"),
    (errors.TextQuotaExceeded(), 429, "text_quota"),
    (errors.ServiceBusy(), 503, "busy"),
    (errors.ImageStoreFull(), 503, "image_store_full"),
    (SlotRefused("Too many answers from your network."), 429, "address_busy"),
    (UploadRejected("This file is not an image we can read."), 400, "invalid_image"),
    (redis.ConnectionError("refused"), 503, "queue_unreachable"),
    (RuntimeError("a bug"), 500, "internal_error"),
])
def test_each_refusal_has_its_status_and_a_sentence(exc, status, code):
    error = from_exception(exc)
    assert (error.status, error.code) == (status, code)
    body = error.body()["error"]
    assert body["message"] and body["type"] and "Traceback" not in body["message"]
    if status in (429, 503):
        assert int(error.response().headers["retry-after"]) >= 1, "it says when to come back"
    if code == "internal_error":
        assert "a bug" not in body["message"], "an internal error's details stay in the log"


def test_a_window_says_how_long_to_wait():
    refusal = errors.RateLimited()
    refusal.retry_after_s = 42.3
    assert from_exception(refusal).response().headers["retry-after"] == "43"


def test_a_failed_answer_is_the_question_s_fault_only_when_the_worker_says_so():
    assert for_failed_answer("invalid", "Too long for the model.").status == 400
    assert for_failed_answer("engine", "The engine failed.").status == 500
    assert for_failed_answer(None, "The worker was lost.").status == 503


def run_edge(path: str, status: int, body: bytes, content_type: bytes = b"text/plain") -> tuple[dict, bytes]:
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type), (b"retry-after", b"10")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    asyncio.run(ApiErrors(app, max_body_bytes=1 << 20)({"type": "http", "path": path, "method": "POST"}, receive,
                                                       send))
    start, *bodies = sent
    return start, b"".join(m.get("body", b"") for m in bodies)


def test_the_edge_s_refusals_on_api_paths_become_error_objects_and_keep_their_headers():
    start, body = run_edge("/v1/chat/completions", 429, b"Too many answers being received from your network.")
    headers = dict(start["headers"])
    assert start["status"] == 429 and headers[b"content-type"] == b"application/json"
    assert headers[b"retry-after"] == b"10" and int(headers[b"content-length"]) == len(body)
    assert json.loads(body)["error"]["message"] == "Too many answers being received from your network."
    own = ApiError(400, "own words").body()
    assert run_edge("/v1/models", 400, json.dumps(own).encode(), b"application/json")[1] == json.dumps(own).encode()
    assert run_edge("/gradio_api/upload", 429, b"plain")[1] == b"plain", "the page's own routes are untouched"
    assert run_edge("/v1/models", 200, b'{"object": "list"}')[1] == b'{"object": "list"}'


def _all_subclasses(cls) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_all_subclasses(sub)]
    return found


OWLET_ERRORS = _all_subclasses(errors.OwletError)


def test_every_owlet_error_declares_its_metric_kind_status_and_code():
    """One table: each error class says how it is counted and answered (an inherited answer would be a guess)."""
    assert len(OWLET_ERRORS) >= 13, "the subclasses of OwletError were not found"
    for cls in OWLET_ERRORS:
        missing = [name for name in ("metric_kind", "http_status", "api_code") if name not in vars(cls)]
        assert not missing, f"{cls.__name__} declares no {missing}"
        assert isinstance(cls.metric_kind, str) and isinstance(cls.api_code, str) and 400 <= cls.http_status < 600


@pytest.mark.parametrize("cls", OWLET_ERRORS, ids=lambda cls: cls.__name__)
def test_the_api_and_the_page_use_what_each_error_declares(cls):
    from ui.chat.turn_errors import TurnErrors
    from ui.edge.refusal_brake import RefusalLedger
    from ui.ops.metrics import UIMetrics

    error = from_exception(cls())
    assert (error.status, error.code, error.message) == (cls.http_status, cls.api_code, cls.user_message)
    metrics = UIMetrics()
    assert TurnErrors(metrics, RefusalLedger(100, 60.0)).sentence(cls(), "10.0.0.1") == cls.user_message
    assert metrics.errors.labels(cls.metric_kind)._value.get() == 1
    assert metrics.errors.labels("other")._value.get() == 0
