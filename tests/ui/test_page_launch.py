"""The page starts on a slow or proxied machine, and says so clearly when it truly cannot be served (ui.ops.launch).

Gradio's own start-up check gave up after one 3-second HEAD request and killed a healthy page process with
"When localhost is not accessible, a shareable link must be created" (seen once in CI under load).
"""
from __future__ import annotations

import http.server
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.ui.stack import ROOT, free_port, read_until_served
from ui.ops.launch import PageNotServed, keep_loopback_off_proxies, wait_until_served

pytestmark = pytest.mark.timeout(120)


class SlowFirstAnswer(http.server.BaseHTTPRequestHandler):
    """Answers 200, but the first request of the server waits ``delay_s`` first (a page busy starting)."""

    delay_s = 4.0
    answered = 0

    def do_HEAD(self):
        if type(self).answered == 0:
            time.sleep(self.delay_s)
        type(self).answered += 1
        self.send_response(200)
        self.end_headers()

    def log_message(self, *_args):
        pass


def test_a_front_page_slower_than_gradios_three_seconds_still_counts_as_served():
    from gradio import networking

    for check, expect_served in ((networking.url_ok, False), (wait_until_served, True)):
        handler = type("Slow", (SlowFirstAnswer,), {"answered": 0})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        try:
            if expect_served:
                took = check(url, timeout_s=30)
                assert took >= SlowFirstAnswer.delay_s - 0.5, took
            else:
                assert check(url) is False, "Gradio's check is expected to give up on a 4 s answer"
        finally:
            server.shutdown()
            server.server_close()


def test_a_page_that_never_answers_fails_by_the_deadline_naming_the_address():
    url = f"http://127.0.0.1:{free_port()}/"  # nothing listens there
    start = time.monotonic()
    with pytest.raises(PageNotServed) as caught:
        wait_until_served(url, timeout_s=2)
    assert 2 <= time.monotonic() - start < 15
    assert url in str(caught.value) and "ConnectError" in str(caught.value)


def test_loopback_is_added_to_no_proxy_without_dropping_what_the_operator_listed():
    environ = {"NO_PROXY": "internal.example, 127.0.0.1"}
    keep_loopback_off_proxies(environ)
    assert environ["NO_PROXY"].split(",") == ["internal.example", "127.0.0.1", "localhost", "::1"]
    assert environ["no_proxy"].split(",") == ["127.0.0.1", "localhost", "::1"]
    keep_loopback_off_proxies(environ)
    assert environ["NO_PROXY"].split(",") == ["internal.example", "127.0.0.1", "localhost", "::1"], "idempotent"


def test_python_m_ui_serves_with_an_http_proxy_that_cannot_reach_this_machine():
    """Corporate machines set HTTP_PROXY; Gradio called its own server through it and the page died."""
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    port = free_port()
    with running_redis() as redis_url:
        env = {key: value for key, value in os.environ.items() if key.lower() != "no_proxy"}
        env.update(HTTP_PROXY=dead_proxy, HTTPS_PROXY=dead_proxy, ALL_PROXY=dead_proxy, http_proxy=dead_proxy,
                   https_proxy=dead_proxy, OWLET_KEY_PREFIX=unique_prefix("proxied"), PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "ui", "--port", str(port), "--redis-url", redis_url],
                                cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            seen = read_until_served(proc, timeout_s=90)
            assert any(line.startswith("Owlet UI: http") for line in seen), "".join(seen)
            # The start-up report of Owlet's adaptations of Gradio (ui.gradio_adapters.registry), all applied.
            assert any("(verified): every adaptation applied" in line for line in seen), "".join(seen)
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            assert direct.open(f"http://127.0.0.1:{port}/", timeout=30).status == 200
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def test_python_m_ui_on_a_redis_without_functions_exits_1_with_one_clear_line(tmp_path):
    """A Redis older than 7.0 has no FUNCTION command (renamed away here): the page says what it needs instead of a
    traceback of Redis's "unknown command" error."""
    from tests.redis_server import OwnedRedis

    server = OwnedRedis(tmp_path / "redis", extra=("--rename-command", "FUNCTION", ""))
    try:
        env = dict(os.environ, OWLET_KEY_PREFIX=unique_prefix("no-functions"), PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-m", "ui", "--port", str(free_port()), "--redis-url", server.url],
                              cwd="/", env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "has no FUNCTION command: Owlet runs its queue as a library of Redis functions" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_python_m_ui_with_a_wrong_redis_password_says_so_and_never_prints_it(tmp_path):
    """Redis answers but refuses the login: the page says that (not "no Redis answers ... start Redis"), and the
    password in the URL is not printed where a terminal or a log keeps it."""
    from tests.redis_server import OwnedRedis

    import redis

    server = OwnedRedis(tmp_path / "redis")
    try:
        redis.Redis.from_url(server.url).config_set("requirepass", "the-right-one")
        url = f"redis://:not-the-password@127.0.0.1:{server.port}/0"
        env = dict(os.environ, OWLET_KEY_PREFIX=unique_prefix("wrong-password"), PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-m", "ui", "--port", str(free_port()), "--redis-url", url],
                              cwd="/", env=env, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"the Redis at redis://:***@127.0.0.1:{server.port}/0 refused the login" in proc.stderr, proc.stderr
    assert "not-the-password" not in proc.stdout + proc.stderr and "Traceback" not in proc.stderr


def test_python_m_ui_on_a_port_already_taken_exits_1_with_one_clear_line():
    import socket

    with running_redis() as redis_url, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = dict(os.environ, OWLET_KEY_PREFIX=unique_prefix("taken"), PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-m", "ui", "--port", str(port), "--redis-url", redis_url], cwd="/",
                              env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"cannot serve the page on 127.0.0.1:{port}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("name, raw, said", [
    ("OWLET_USER_QUEUE_CAP", "lots", "OWLET_USER_QUEUE_CAP='lots' is not an integer"),
    ("OWLET_STREAM_TTL_S", "0", "stream_ttl_s must be above 0"),
])
def test_python_m_ui_with_a_bad_queue_setting_exits_2_with_one_clear_line(name, raw, said):
    """The page reads the queue's settings too (``worker.config.Settings``): a bad one is a bad setting, said in one
    line before anything starts, as a bad page setting is (it was a traceback from inside the page's start)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), **{name: raw})
    proc = subprocess.run([sys.executable, "-m", "ui", "--port", str(free_port())], cwd="/", env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"owlet-page: bad setting: {said}" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr


def test_python_m_ui_serves_on_an_ipv6_address():
    """``--host ::`` (a platform's IPv6-only private network) ended the start with httpx's "Invalid port: '::7860'":
    Gradio builds its own address from the name, which an IPv6 address must give in brackets."""
    import socket

    try:
        socket.socket(socket.AF_INET6).bind(("::1", 0))
    except OSError:
        pytest.skip("this machine has no IPv6 loopback")
    port = free_port()
    with running_redis() as redis_url:
        env = dict(os.environ, OWLET_KEY_PREFIX=unique_prefix("ipv6"), PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-m", "ui", "--host", "::", "--port", str(port), "--redis-url",
                                 redis_url], cwd="/", env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        try:
            seen = read_until_served(proc, timeout_s=90)
            assert any(line.startswith(f"Owlet UI: http://[::]:{port}/") for line in seen), "".join(seen)
            direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            assert direct.open(f"http://[::1]:{port}/", timeout=30).status == 200
        finally:
            proc.terminate()
            proc.wait(timeout=30)
