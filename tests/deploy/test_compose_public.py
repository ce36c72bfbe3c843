"""The `public` compose profile's proxy runs on this host, in front of compose's page, and serves the public.

Its exact command and configuration (docker-compose.yml's `proxy`, deploy/public/nginx.conf) run under Debian's
nginx, with what Docker would change, and nothing else: the files mounted into the container are read from the
checkout and from OWLET_TLS_DIR (a self-signed certificate made here), the prefix is a folder of this test's, the
page's service name is its address here, and the published ports are free ports on 127.0.0.1. The page runs with
compose's environment, whose default trusted proxy is the proxy's fixed address, here 127.0.0.1.

Checked: TLS, a question answered through the proxy with gradio_client, 16 visitors from 16 addresses (each forging
an X-Forwarded-For) counted by the queue as 16 clients, HTTP sent to HTTPS, and a client holding more than the
proxy's connection limit refused by nginx before the page sees it.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest
import redis
from gradio_client import Client

from tests.deploy.compose_on_host import load_compose, mounted
from tests.deploy.compose_stack import COMPOSE_ENV, HOST
from tests.deploy.services import ROOT, Service, host_tool
from tests.ui.page_client import ask, bubble_text
from tests.ui.stack import free_port, make_image

pytestmark = pytest.mark.timeout(300)
VISITORS = 16


def self_signed(folder: Path) -> None:
    """cert.pem and key.pem for 127.0.0.1, as an operator would put in OWLET_TLS_DIR."""
    openssl = host_tool("openssl")
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=owlet-test",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(folder / "key.pem"),
                    "-out", str(folder / "cert.pem")], check=True, capture_output=True, timeout=60)


def proxy_on_host(stack, tls_dir: Path, prefix: Path) -> tuple[list[str], dict[str, int]]:
    """The proxy service's command, and its published ports, as they run here. Returns (argv, {container port:
    host port})."""
    service = load_compose(ROOT / "docker-compose.yml", {**COMPOSE_ENV, "OWLET_TLS_DIR": str(tls_dir)})[
        "services"]["proxy"]
    argv = list(service["command"])
    assert argv[0] == "nginx", argv
    argv[0] = host_tool("nginx", "/usr/sbin/nginx")
    ports = {int(p.split(":")[-1]): free_port() for p in service["ports"]}
    volumes = service["volumes"]
    config_in_container = argv[argv.index("-c") + 1]
    config = Path(mounted(config_in_container, volumes, ROOT)).read_text()
    # What Docker changes: mounted paths, the page's address on the network, the ports published on the host.
    for volume in volumes:
        inside = volume.split(":")[1]
        config = config.replace(inside, mounted(inside, volumes, ROOT))
    upstream = re.search(r"server (ui):(\d+);", config)
    assert upstream and int(upstream.group(2)) == int(stack.services["ui"]["ports"][0].split(":")[-1])
    config = config.replace(upstream.group(0), f"server {HOST}:{stack.ui_port};")
    for inside, outside in ports.items():
        config, found = re.subn(rf"listen {inside}( ssl)?;", rf"listen {HOST}:{outside}\1;", config)
        assert found == 1, f"port {inside} is published but not listened on"
    (prefix / "nginx.conf").write_text(config)
    argv[argv.index("-c") + 1] = str(prefix / "nginx.conf")
    argv[argv.index("-p") + 1] = str(prefix) + "/"
    return argv, ports


def wait_for_port(port: int, proxy: Service, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        proxy.check_alive()
        try:
            socket.create_connection((HOST, port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"the proxy did not listen on {port}:\n{proxy.output()}")


def visitor(base: str, source: str) -> httpx.Client:
    """A visitor at address ``source`` (a loopback address of its own) reaching the proxy over TLS, who also writes
    a made-up X-Forwarded-For of its own."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source, verify=False), base_url=base,
                        headers={"X-Forwarded-For": "6.6.6.6"}, timeout=120)


def call(client: httpx.Client, api: str, data: list) -> list:
    """One event of the page's API; every payload it streamed."""
    event = client.post(f"gradio_api/call/{api}", json={"data": data})
    event.raise_for_status()
    payloads, kind = [], None
    with client.stream("GET", f"gradio_api/call/{api}/{event.json()['event_id']}") as stream:
        for line in stream.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                assert kind != "error", line
                payloads.append(json.loads(line.split(":", 1)[1]))
                if kind == "complete":
                    break
    return payloads


def test_the_public_proxy_terminates_tls_answers_and_counts_each_visitor(compose_stack, tmp_path):
    tls_dir = tmp_path / "tls"
    tls_dir.mkdir()
    self_signed(tls_dir)
    prefix = Path(tempfile.mkdtemp(prefix="owlet-nginx-"))
    os.chmod(prefix, 0o755)  # nginx's workers (nobody) keep request bodies under the prefix
    argv, ports = proxy_on_host(compose_stack, tls_dir, prefix)
    proxy = Service("proxy", argv, dict(os.environ), prefix, tmp_path)
    try:
        wait_for_port(ports[443], proxy)
        base = f"https://{HOST}:{ports[443]}/"
        redirect = httpx.get(f"http://{HOST}:{ports[80]}/some/where", timeout=10)
        assert redirect.status_code == 301 and redirect.headers["location"].startswith("https://")

        # The real client people use, over TLS through the proxy.
        client = Client(base, verbose=False, ssl_verify=False)
        _outputs, (_box, chat, status) = ask(client, "How many shapes are there?",
                                             make_image(tmp_path / "scene.png"), max_new_tokens=8)
        assert "Answered in" in status and bubble_text(chat[-1]).strip(), status
        client.close()

        # 16 visitors at once, each from its own address: 16 clients in the fair queue, whatever they forge.
        statuses: dict[str, str] = {}

        def one_visit(i: int) -> None:
            with visitor(base, f"127.0.0.{20 + i}") as http:
                token = call(http, "identity", [None])[-1][0]
                statuses[f"127.0.0.{20 + i}"] = call(http, "chat", [{"text": f"visitor {i}: how many shapes?",
                                                                     "files": []}, 8, token])[-1][2]
        threads = [threading.Thread(target=one_visit, args=(i,)) for i in range(VISITORS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(240)
        assert len(statuses) == VISITORS and all("Answered in" in s for s in statuses.values()), statuses
        r = redis.Redis(host=HOST, port=compose_stack.redis_port)
        groups = {r.hget(key, "group") for key in r.scan_iter(match="owlet:job:*", count=1000)
                  if r.type(key) == b"hash" and r.hget(key, "group")}
        r.close()
        visitors = {g.decode() for g in groups if g.decode().startswith("addr:127.0.0.") and g != b"addr:127.0.0.1"}
        assert visitors == {f"addr:{address}" for address in statuses}, groups

        # One client holding more requests than the proxy's limit: nginx refuses the rest itself.
        limit = int(re.search(r"limit_conn per_client (\d+);", (ROOT / "deploy/public/nginx.conf").read_text())[1])
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        held = []
        try:
            for _ in range(limit):
                sock = context.wrap_socket(socket.create_connection((HOST, ports[443]), timeout=10),
                                           server_hostname=HOST)
                sock.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nslow")
                held.append(sock)
            time.sleep(0.5)
            over = httpx.get(base + "config", verify=False, timeout=10)
            assert over.status_code == 429 and "nginx" in over.text, (over.status_code, over.text[:200])
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        while httpx.get(base + "config", verify=False, timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "the client's connections are its own again once it lets go"
            time.sleep(0.2)
    finally:
        proxy.stop()
        shutil.rmtree(prefix, ignore_errors=True)


def test_the_proxies_wait_longer_than_a_question_may_take():
    """An API request that does not stream hears nothing while its question waits in line and is answered: a proxy
    that gives up sooner answers 504 and the page cancels the answer. The public profile's nginx and the README's
    block for a page under a path of its own both wait longer than the longest such silence, at the settings' defaults
    (compose passes them on unchanged unless set)."""
    from worker.config import Settings

    settings = Settings()
    longest = settings.queue_timeout_s + settings.job_deadline_s
    readme = re.search(r"```nginx\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    for name, text in (("deploy/public/nginx.conf", (ROOT / "deploy/public/nginx.conf").read_text()),
                       ("README's nginx block", readme.group(1) if readme else "")):
        waits = [int(s) for s in re.findall(r"proxy_read_timeout (\d+)s;", text)]
        assert waits and min(waits) > longest, f"{name}: proxy_read_timeout {waits} s, a question may take {longest} s"
