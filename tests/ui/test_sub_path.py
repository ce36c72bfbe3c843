"""The page served under a path of its own behind nginx (README "Running it in public": ``OWLET_UI_ROOT_PATH`` and the
README's own ``location`` block, read from it): Chromium loads it, uploads a picture, asks and reloads with every
request answered and every picture shown; the OpenAI client and gradio_client reach it through the same path."""
from __future__ import annotations

import os
import re
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import openai
import pytest
from gradio_client import Client

from tests.deploy.services import host_tool
from tests.ui.page_client import ask as ask_through_gradio_client
from tests.ui.page_client import bubble_text
from tests.ui.stack import ROOT, free_port, launched_page, make_image
from tests.ui.test_browser import CHROMIUM, LAUNCH_ARGS, USER
from tests.ui.test_browser import ask as ask_in_the_browser
from ui.config import UIConfig

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]

PATH = "/owlet"


def readme_location_block() -> str:
    """The nginx block README gives for a page under /owlet/, as written there."""
    found = re.search(r"```nginx\n\s*(location /owlet/ \{.*?\n\s*\})\n\s*```", (ROOT / "README.md").read_text(), re.S)
    assert found, "README's nginx block for a page under /owlet/ is gone"
    return "\n".join(line.strip() for line in found.group(1).splitlines())


def nginx_in_front(page_port: int, folder: Path) -> tuple[subprocess.Popen, int]:
    """nginx on a free port with README's block, its upstream the page's port; (the process, its port)."""
    port = free_port()
    block = readme_location_block().replace("http://127.0.0.1:7860/", f"http://127.0.0.1:{page_port}/")
    assert f"127.0.0.1:{page_port}" in block
    temp = " ".join(f"{kind}_temp_path {folder}/{kind};"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (folder / "nginx.conf").write_text(
        f"daemon off; worker_processes 1; pid {folder}/nginx.pid; error_log {folder}/error.log;\n"
        f"events {{ worker_connections 256; }}\n"
        f"http {{ access_log {folder}/access.log; {temp}\n"
        f"server {{ listen 127.0.0.1:{port};\n{block}\n}} }}\n")
    nginx = host_tool("nginx", "/usr/sbin/nginx")
    proc = subprocess.Popen([nginx, "-p", f"{folder}/", "-c", str(folder / "nginx.conf")], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"nginx ended: {proc.stdout.read()}"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("nginx did not listen")


def conversation_keys(owlet) -> set[bytes]:
    return set(owlet.r.scan_iter(match=owlet.keys.prefix + "conv:*", count=1000))


def images_shown(page) -> list[tuple[str, int]]:
    return page.evaluate("[...document.querySelectorAll('#owlet-chat img')].map(i => [i.src, i.naturalWidth])")


def test_the_page_and_its_api_under_a_path_of_their_own(stack, tmp_path):
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="owlet-nginx-"))
    os.chmod(folder, 0o755)  # nginx's workers keep request bodies under it
    config = UIConfig(port=free_port(), redis_url=stack.redis_url, key_prefix=stack.prefix, queue_poll_s=0.5,
                      root_path=PATH, trusted_proxies=("127.0.0.1",))
    with launched_page(config, purge=False) as (_direct_url, owlet):
        before = conversation_keys(owlet)
        proxy, port = nginx_in_front(config.port, folder)
        try:
            base = f"http://127.0.0.1:{port}{PATH}/"
            with sync_playwright() as p:
                browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
                page = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
                failed: list[str] = []
                page.on("response", lambda r: failed.append(f"{r.status} {r.url}") if r.status >= 400 else None)
                # (a reload or the end aborts the page's open streams: not a failure of the path)
                page.on("requestfailed", lambda r: None if "ABORTED" in (r.failure or "") else failed.append(
                    f"failed {r.url}: {r.failure}"))
                page.goto(base)
                page.wait_for_selector("#owlet-input textarea", timeout=60_000)
                page.locator("#owlet-input input[type=file]").set_input_files(str(make_image(tmp_path / "red.png")))
                page.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
                seen, _status = ask_in_the_browser(page, "What colour is the shape?")
                assert seen, "an answer streamed"
                page.wait_for_function(f"document.querySelector('{USER} img')?.naturalWidth > 0", timeout=10_000)
                shown = images_shown(page)
                assert shown and all(src.startswith(base) and width > 0 for src, width in shown), shown

                page.reload()  # the conversation comes back, its picture drawn from under the path too
                page.wait_for_function(f"document.querySelector('{USER} img')?.naturalWidth > 0", timeout=30_000)
                shown = images_shown(page)
                assert shown and all(src.startswith(base) and width > 0 for src, width in shown), shown
                browser.close()
            # Every request the page made went under the path and was answered (a browser asks for the site's
            # /favicon.ico by itself).
            assert [f for f in failed if not f.endswith("/favicon.ico")] == [], failed
            outside = [line for line in (folder / "access.log").read_text().splitlines()
                       if '"GET /favicon.ico' not in line and f'"GET {PATH}/' not in line
                       and f'"POST {PATH}/' not in line]
            assert outside == [], outside

            # The API and the Gradio client, through the same path.
            key = httpx.get(f"{base}v1/key", timeout=30).json()["key"]
            api = openai.OpenAI(base_url=f"{base}v1", api_key=key, timeout=120)
            answer = api.chat.completions.create(model=api.models.list().data[0].id, max_tokens=8,
                                                 messages=[{"role": "user", "content": "Hello?"}])
            assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.completion_tokens > 0
            _outputs, final = ask_through_gradio_client(Client(base, verbose=False), "Hello from gradio_client?",
                                                        make_image(tmp_path / "blue.png", colour=(0, 0, 200)))
            assert final[1][-1]["role"] == "assistant" and bubble_text(final[1][-1]), final[1][-1]
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)
            made = conversation_keys(owlet) - before  # the stack is shared: leave none of this test's behind
            if made:
                owlet.r.delete(*made)


def test_a_root_path_is_a_path_from_the_hosts_root_or_a_whole_url():
    for good in ("", "/owlet", "/apps/owlet", "https://example.com/owlet", "http://example.com"):
        assert UIConfig(root_path=good).root_path == good
    for bad, why in (("owlet", "must start with '/'"), ("/owlet/", "without a '/' at its end"),
                     ("//evil.example/owlet", "must start with '/'"), ("/", "without a '/' at its end"),
                     ("/owl et", "spaces"), ("ftp://example.com/owlet", "must start with '/'")):
        with pytest.raises(ValueError, match=re.escape(why)):
            UIConfig(root_path=bad)
    assert UIConfig.from_env({"OWLET_UI_ROOT_PATH": "/owlet"}).root_path == "/owlet"
