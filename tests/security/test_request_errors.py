"""Requests whose content makes Gradio's API code raise: 400 and a sentence, not 500 and a traceback a call
(ui.edge.request_errors)."""
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


def test_a_refused_direct_call_is_a_400_and_logs_one_short_line_without_its_inputs(page, caplog):
    """/run/<api> answered every refusal with 500, and the log line carried the refused inputs whole: 90 KB a
    request, the caller's identity token included."""
    secret = "v1.secret-looking-token"
    with caplog.at_level(logging.INFO):
        for path in ("gradio_api/run/chat", "gradio_api/api/chat"):
            response = httpx.post(page + path, json={"data": [{"text": "A" * 60_000, "files": []}, 8, secret]},
                                  timeout=30)  # 3 inputs where the event takes 4
            assert response.status_code == 400, (path, response.status_code)
            assert "This request could not be read" in response.json()["error"]
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert secret not in logged and "AAAA" not in logged, "the inputs are not logged"
    assert all(len(r.getMessage()) < 400 for r in caplog.records)


@pytest.mark.parametrize("path", ["gradio_api/run/chat", "gradio_api/api/chat"])
def test_an_answer_length_out_of_range_is_refused_without_a_traceback(page, capfd, path):
    """Gradio printed a 2 KB traceback for each out-of-range slider value: 2,000 requests from one address wrote
    4.4 MB of log in 7 s."""
    capfd.readouterr()
    for length in (-5, 0, 10**12):
        response = httpx.post(page + path, json={"data": [{"text": "hi", "files": []}, length, None, None],
                                                 "session_hash": "same-session"}, timeout=30)
        assert response.status_code == 400, response.text
        assert "minimum" in response.json()["error"] or "maximum" in response.json()["error"]
    printed = capfd.readouterr()
    assert "Traceback" not in printed.out + printed.err, (printed.out + printed.err)[-2000:]


def test_an_event_stream_that_gradio_fails_mid_response_ends_without_a_traceback(caplog):
    """Two connections reading one session's event stream: when one ended the session's messages, Gradio raised a
    404 inside the other's body and uvicorn logged a 3.4 KB traceback, as often as a client liked."""
    import asyncio

    from starlette.exceptions import HTTPException

    from ui.edge.request_errors import RequestErrors

    async def failing_stream(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        raise HTTPException(status_code=404)

    sent = []

    async def send(message):
        sent.append(message)

    async def run(path):
        await RequestErrors(failing_stream)({"type": "http", "method": "GET", "path": path}, None, send)

    with caplog.at_level(logging.WARNING):
        asyncio.run(run("/gradio_api/queue/data"))  # no exception out of the middleware: nothing for uvicorn
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}, "the stream is ended"
    assert [r.getMessage() for r in caplog.records] == [
        "ended an event stream Gradio failed mid-response: HTTPException: 404: Not Found"]
    with pytest.raises(HTTPException):  # any other route's failure after its start still goes up
        asyncio.run(run("/gradio_api/call/chat/abc"))


def test_only_refusals_worded_for_the_caller_become_400s():
    """A 500 whose ``error`` is null (an internal failure, not shown to the caller) stays a 500."""
    import asyncio
    import json

    from ui.edge.request_errors import _refusals_as_400

    def sent_status(status: int, body: dict) -> int:
        out = []

        async def send(message):
            out.append(message)

        async def run():
            rewriting = _refusals_as_400(send)
            await rewriting({"type": "http.response.start", "status": status, "headers": []})
            await rewriting({"type": "http.response.body", "body": json.dumps(body).encode(), "more_body": False})
        asyncio.run(run())
        assert json.loads(out[-1]["body"]) == body, "the body goes out unchanged"
        return out[0]["status"]

    assert sent_status(500, {"error": "This request could not be read: ..."}) == 400
    assert sent_status(500, {"error": None}) == 500
    assert sent_status(200, {"data": [1]}) == 200


SERVED_PAGE = """
import socket, sys, time
from ui.__main__ import config_from_args, parse_args
from ui.server import serve
config = config_from_args(parse_args(["--port", sys.argv[1], "--redis-url", sys.argv[2]]))
page = serve(config, block=False)
for _ in range(100):  # requests uvicorn cannot parse: it logs a warning for each
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10) as s:
        s.sendall(b"NOT HTTP AT ALL\\r\\n\\r\\n")
        s.recv(1024)
time.sleep(0.5)
page.close()
print("SENT", flush=True)
"""


def test_the_libraries_under_the_page_log_malformed_requests_on_a_budget():
    """uvicorn logged "Invalid HTTP request received." for every request it could not parse (41 B each, as fast as
    a client could send them); now at most 20 such lines a minute."""
    import os
    import subprocess
    import sys

    from tests.ui.stack import ROOT

    with running_redis() as redis_url:
        env = dict(os.environ, OWLET_KEY_PREFIX=unique_prefix("budget"), PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-c", SERVED_PAGE, str(free_port()), redis_url], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240)
    assert "SENT" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]
    logged = (proc.stdout + proc.stderr).count("Invalid HTTP request received")
    assert 1 <= logged <= 20, logged
