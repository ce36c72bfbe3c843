"""Requests that stay open (ui.edge.held_connections): a few per address, and uploads that must arrive in time.

Heartbeat and event streams cost no page event, so one address could hold thousands of them (each a file
descriptor and a task on the event loop that streams every answer), and an upload whose body trickled in was
never timed out."""
from __future__ import annotations

import contextlib
import socket
import time

import httpx
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.edge.held_connections import held_kind

pytestmark = pytest.mark.timeout(180)


def test_which_requests_count_as_held_and_as_what():
    def kind(method, path):
        return held_kind({"type": "http", "method": method, "path": path})
    assert kind("GET", "/gradio_api/heartbeat/abc") == "heartbeat"
    assert kind("GET", "/gradio_api/queue/data") == kind("GET", "/gradio_api/call/chat/0f2c") == "stream"
    assert kind("POST", "/v1/chat/completions") == "stream", "an API answer is held for as long as it streams"
    for path in ("/gradio_api/upload", "/gradio_api/call/chat", "/gradio_api/queue/join", "/gradio_api/run/chat"):
        assert kind("POST", path) == "body", path  # every body may trickle in
    for path in ("/gradio_api/call/chat", "/config", "/", "/assets/index.js", "/gradio_api/file=/tmp/a.png"):
        assert kind("GET", path) == "download", path  # held while the response is read
    for method, path in [("HEAD", "/gradio_api/heartbeat/abc"), ("OPTIONS", "/")]:
        assert kind(method, path) is None, path


def test_downloads_that_are_never_read_hold_a_place_of_their_own():
    """A GET whose response the client never reads holds a descriptor and kernel memory for as long as it likes:
    200 downloads of the page's largest script from one address held 400 descriptors and 750 MB of TCP
    memory. Downloads now have a per-address cap of their own; the places come back as responses are read."""
    import asyncio

    from ui.edge.held_connections import HeldConnections

    read = asyncio.Event()

    async def slow_reader_app(scope, receive, send):  # its last send waits, as one to a client that never reads
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"x" * 1024, "more_body": True})
        await read.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    guarded = HeldConnections(slow_reader_app, per_address=2, upload_timeout_s=5, per_address_downloads=3)

    def client(address):
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=guarded, client=(address, 4000)),
                                 base_url="http://page")

    async def scenario():
        async with client("203.0.113.9") as hostile, client("198.51.100.9") as other:
            held = [asyncio.create_task(hostile.get(f"/assets/big-{i}.js")) for i in range(3)]
            await asyncio.sleep(0.2)
            refused = await hostile.get("/assets/big-3.js")
            assert refused.status_code == 429 and "Too many downloads" in refused.text
            elsewhere = asyncio.create_task(other.get("/assets/big-0.js"))
            await asyncio.sleep(0.2)
            assert not elsewhere.done(), "another address downloads (and is held like any reader)"
            read.set()  # the responses are read: every place comes back
            assert [r.status_code for r in await asyncio.gather(*held, elsewhere)] == [200] * 4
            assert (await hostile.get("/assets/big-4.js")).status_code == 200

    asyncio.run(scenario())


@contextlib.contextmanager
def page(**overrides):
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("held"),
                          trusted_proxies=("127.0.0.1",), **overrides)
        with launched_page(config) as (url, _client):
            yield url, config


def heartbeat(stack: contextlib.ExitStack, url: str, address: str, tab: str) -> httpx.Response:
    client = stack.enter_context(httpx.Client(headers={"X-Forwarded-For": address}, timeout=30))
    return stack.enter_context(client.stream("GET", f"{url}gradio_api/heartbeat/{tab}"))


def test_one_address_holds_a_few_streams_and_others_are_unaffected():
    with page(address_max_connections=3) as (url, _config), contextlib.ExitStack() as held:
        opened = [heartbeat(held, url, "203.0.113.5", f"tab{i}") for i in range(3)]
        assert [r.status_code for r in opened] == [200, 200, 200]
        with contextlib.ExitStack() as more:
            refused = heartbeat(more, url, "203.0.113.5", "tab9")
            assert refused.status_code == 429
            assert refused.read().decode().startswith("Too many open tabs of this page from your network")
            other = heartbeat(more, url, "198.51.100.5", "tab11")
            assert other.status_code == 200, "another address is not affected"
        # idle heartbeats do not take the places a tab on the same address needs to ask and to upload
        with httpx.Client(headers={"X-Forwarded-For": "203.0.113.5"}, timeout=30) as same_address:
            for _ in range(5):
                assert same_address.post(f"{url}gradio_api/upload",
                                         files={"files": ("a.png", b"x" * 100)}).status_code == 200
                joined = same_address.post(f"{url}gradio_api/queue/join",
                                           json={"data": [None], "fn_index": 0, "session_hash": "tab0"})
                assert joined.status_code == 200, joined.text[:200]
        opened[0].close()  # a stream ends: its place is free again
        deadline = time.monotonic() + 10
        while True:
            with contextlib.ExitStack() as again:
                if heartbeat(again, url, "203.0.113.5", "tab10").status_code == 200:
                    break
            assert time.monotonic() < deadline, "a closed stream never gave its place back"
            time.sleep(0.2)


def test_an_upload_that_trickles_in_is_abandoned_at_the_deadline():
    with page(upload_timeout_s=1.5, address_max_connections=2) as (url, config):
        body_start = (b"--b\r\nContent-Disposition: form-data; name=\"files\"; filename=\"a.png\"\r\n"
                      b"Content-Type: image/png\r\n\r\n")
        head = (f"POST /gradio_api/upload HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-For: 203.0.113.7\r\n"
                f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n").encode()
        started = time.monotonic()
        with socket.create_connection(("127.0.0.1", config.port), timeout=20) as slow:
            slow.sendall(head + body_start + b"x" * 100)
            answer = b""
            with contextlib.suppress(OSError):
                while time.monotonic() - started < 15:  # keep trickling: one byte a quarter second
                    slow.sendall(b"x")
                    slow.settimeout(0.25)
                    try:
                        chunk = slow.recv(4096)
                    except socket.timeout:
                        continue
                    if not chunk:
                        break
                    answer += chunk
                    break
        took = time.monotonic() - started
        assert 1.0 <= took < 10, f"the upload was held {took:.1f} s"
        assert not answer or not answer.startswith(b"HTTP/1.1 200"), answer[:80]
        with httpx.Client(headers={"X-Forwarded-For": "203.0.113.7"}, timeout=30) as client:  # its place is free
            for _ in range(2):
                ok = client.post(f"{url}gradio_api/upload", files={"files": ("b.png", b"y" * 100)})
                assert ok.status_code == 200, ok.text[:200]


def test_the_page_raises_its_open_files_limit_toward_the_hard_one():
    import resource
    import subprocess
    import sys

    def low_soft_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    script = ("import resource; from ui.server import raise_open_files_limit; "
              "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0], raise_open_files_limit(4096), "
              "resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                         preexec_fn=low_soft_limit).stdout.split()
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    assert out == ["256", str(expected), str(expected)], out


def test_connections_whose_headers_never_finish_are_closed(monkeypatch):
    """uvicorn timed out nothing before a request reached the page: a connection sending no bytes, or trickling
    its headers, stayed open for ever, out of every per-address limit's sight."""
    from ui.edge import header_deadline

    monkeypatch.setattr(header_deadline, "HEADER_TIMEOUT_S", 1.0)
    with page() as (url, config):
        def held_for(first: bytes, trickle: bytes = b"") -> float:
            started = time.monotonic()
            with socket.create_connection(("127.0.0.1", config.port), timeout=20) as sock:
                if first:
                    sock.sendall(first)
                sock.settimeout(0.2)
                while time.monotonic() - started < 15:
                    try:
                        if not sock.recv(4096):
                            break  # closed by the page
                    except socket.timeout:
                        with contextlib.suppress(OSError):
                            if trickle:
                                sock.sendall(trickle)
                    except OSError:
                        break
            return time.monotonic() - started
        assert held_for(b"") < 5, "a silent connection"
        assert held_for(b"GET /config HTTP/1.1\r\nHost: x\r\n", trickle=b"X") < 5, "headers trickled in"
        with httpx.Client(timeout=30) as client:  # ordinary requests, several on one kept-alive connection
            for _ in range(3):
                assert client.get(f"{url}config").status_code == 200
                time.sleep(0.5)
