"""Only the routes the page uses answer (ui.edge.public_routes).

Gradio mounts many more: ``/gradio_api/deep_link`` wrote a session's saved inputs to a new file on disk on every
call (a ~900 KB "input" a call filled the disk, outside every upload budget), ``/gradio_api/component_server``
made a session entry for any session hash before looking the function up (around the new-tab budget), and
run history acts with the host's Hugging Face token."""
from __future__ import annotations

import httpx
import pytest
from gradio_client import Client

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.edge.public_routes import is_open, without_upload_id

pytestmark = pytest.mark.timeout(180)

CLOSED = ["/gradio_api/deep_link?session_hash=abc", "/gradio_api/component_server",
          "/gradio_api/process_recording", "/gradio_api/run-history/buckets", "/gradio_api/runs",
          "/gradio_api/stream/abc", "/gradio_api/vibe-code", "/gradio_api/undo-vibe-edit",
          "/gradio_api/dev/reload", "/gradio_api/token", "/gradio_api/proxy=https://x.hf.space/a",
          "/gradio_api/custom_component/1/client/js/index.js", "/openapi.json", "/gradio_api/openapi.json",
          "/monitoring", "/gradio_api/some-route-a-later-gradio-adds", "/v1/completions", "/v1/embeddings",
          "/v1/models/a/b", "/v1/chat/completions/x"]


def test_the_allow_list_opens_what_the_page_uses_and_nothing_else():
    for path in ("/", "/config", "/gradio_api/info", "/gradio_api/queue/join", "/gradio_api/queue/data",
                 "/gradio_api/upload", "/gradio_api/file=/tmp/x.png", "/gradio_api/heartbeat/abc",
                 "/gradio_api/call/chat", "/gradio_api/run/identity", "/assets/index.js", "/healthz", "/metrics",
                 "/v1/chat/completions", "/v1/models", "/v1/models/owlet-shapes-vl", "/v1/key"):
        assert is_open(path), path
    for path in CLOSED:
        assert not is_open(path.split("?")[0]), path


def test_routes_the_page_does_not_use_are_404_and_write_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("GRADIO_TEMP_DIR", str(tmp_path))
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("routes"))
        with launched_page(config) as (url, _client):
            base = url.rstrip("/")
            visitor = Client(url, verbose=False)
            token = visitor.predict(None, api_name="/identity")  # a session with saved inputs
            assert token.startswith("v1.")
            session = visitor.session_hash
            with httpx.Client(timeout=30) as http:
                deep = http.get(f"{base}/gradio_api/deep_link", params={"session_hash": session})
                assert deep.status_code == 404 and deep.text == "Not found."
                served = http.post(f"{base}/gradio_api/component_server",
                                   json={"session_hash": "fresh", "component_id": 1, "fn_name": "x", "data": None})
                assert served.status_code == 404
                for path in CLOSED:
                    assert http.request("POST" if "recording" in path else "GET", base + path).status_code == 404, \
                        path
                assert http.get(f"{base}/").status_code == 200, "the page itself still answers"
                assert http.get(f"{base}/config").status_code == 200
                uploaded = http.post(f"{base}/gradio_api/upload", files={"files": ("a.png", b"x" * 100)})
                assert uploaded.status_code == 200
            assert any(tmp_path.rglob("a.png")), "the page's upload cache is under tmp_path (so the check below looks)"
            assert not list(tmp_path.rglob("state.json")), "no deep-link file was written"
            assert visitor.predict(None, api_name="/identity").startswith("v1."), "API clients keep working"


def test_a_malformed_session_hash_is_refused_before_gradio_keeps_it():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("routes"))
        with launched_page(config) as (url, _client):
            with httpx.Client(timeout=30) as http:
                for bad in ("x" * 65, "a/b", "ünïcode", "x" * 500_000):
                    refused = http.post(f"{url}gradio_api/queue/join",
                                        json={"data": [None], "fn_index": 0, "session_hash": bad})
                    assert refused.status_code in (400, 413), bad[:10]
                    if len(bad) < 1000:
                        assert refused.status_code == 400 and refused.text.startswith("Malformed session_hash")
                ok = http.post(f"{url}gradio_api/queue/join",
                               json={"data": [None], "fn_index": 0, "session_hash": "Ab_9-xyz"})
                assert ok.status_code == 200, ok.text[:200]


def test_urls_and_upload_progress_are_closed_and_uploads_are_not_tracked():
    """``file=<URL>`` made the page fetch and stream any address (an open proxy); upload progress kept an entry
    per id asked about, for ever (about 40 KB a request with long ids), and polled every 50 ms per stream."""
    for url in ("/gradio_api/file=https://example.com/big.iso", "/gradio_api/file=HTTP://example.com/a",
                "/gradio_api/file= http://example.com/a", "/gradio_api/file=//example.com/a",
                "/gradio_api/file/https://example.com/a", "/gradio_api/upload_progress"):
        assert not is_open(url), url
    assert is_open("/gradio_api/file=/tmp/gradio/abc/cat.png")
    assert without_upload_id(b"upload_id=abc&x=1") == b"x=1"
    assert without_upload_id(b"x=1") == b"x=1"
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("routes"))
        with launched_page(config) as (url, _client):
            from gradio.routes import file_upload_statuses as tracker  # the page's FileUploadProgress

            with httpx.Client(timeout=30) as http:
                for i in range(5):
                    progress = http.get(f"{url}gradio_api/upload_progress", params={"upload_id": f"{i}" + "a" * 30000})
                    assert progress.status_code == 404 and progress.text == "Not found."
                proxied = http.get(f"{url}gradio_api/file=http://127.0.0.1:{config.port}/config")
                assert proxied.status_code == 404, "the page fetched a URL for a stranger"
                uploaded = http.post(f"{url}gradio_api/upload", params={"upload_id": "tracked-1"},
                                     files={"files": ("a.png", b"x" * 100)})
                assert uploaded.status_code == 200 and len(uploaded.json()) == 1, "uploads work without it"
                run_upload = http.post(f"{url}gradio_api/run/upload", content=b"{" + b" " * (2 << 20) + b"}",
                                       headers={"content-type": "application/json"})
                assert run_upload.status_code == 413, "only the upload route gets an upload's body limit"
            assert not tracker._statuses and not tracker._signals, "nothing tracked, nothing kept"
