"""Each front a public page sits behind, with a faithful stand-in in the path: the visitors it delivers are
told apart, a header a visitor forged gains nothing, and a refusal (an upload's included) reaches gradio_client as
a sentence.

- **share**: Gradio's share link (``--share``, nothing else set). Its server (frp) appends the visitor's address to
  ``X-Forwarded-For`` and its client on the host connects from 127.0.0.1: the stand-in is a loopback client sending
  the header as frp passes it on, after whatever the visitor wrote.
- **space**: a platform's proxy on a private network (a Hugging Face Space), ``OWLET_UI_TRUSTED_PROXIES=private``.
- **cloudflare**: a Cloudflare tunnel (cloudflared on the host), which names the visitor in ``CF-Connecting-IP``
  while ``X-Forwarded-For`` holds whatever the visitor sent.

A real reverse proxy (nginx, TLS) is in the path of ``tests/deploy/test_compose_public.py``.
"""
from __future__ import annotations

import random

import pytest
from gradio_client import Client, handle_file
from gradio_client.exceptions import AppError
from PIL import Image

from tests.security.attack import call, http
from tests.security.pages import page_without_worker

pytestmark = pytest.mark.timeout(180)

FRONTS = {
    "share": {"share": True, "trusted_proxies": ()},
    "space": {"trusted_proxies": ("private",)},
    "cloudflare": {"trusted_proxies": ("127.0.0.1",), "client_header": "CF-Connecting-IP"},
}
NEW_TABS = 2
MB = 1024 * 1024


def through(front: str, visitor: str, forged: str = "203.0.113.250") -> dict[str, str]:
    """The headers the front's proxy sends for ``visitor``, who wrote ``forged`` into its own X-Forwarded-For."""
    if front == "cloudflare":
        return {"CF-Connecting-IP": visitor, "X-Forwarded-For": forged}
    return {"X-Forwarded-For": f"{forged}, {visitor}"}


def new_tab(url: str, headers: dict[str, str]) -> int:
    """Open a tab (an /identity call under a new session hash), from loopback; its status."""
    with http(source="127.0.0.1") as client:
        client.headers.update(headers)
        return client.post(f"{url}gradio_api/call/identity", json={"data": [None]}).status_code


def picture(path) -> str:
    """A 600 KB picture nobody else has (random pixels do not compress)."""
    Image.frombytes("RGB", (450, 450), random.randbytes(450 * 450 * 3)).save(path)
    return str(path)


@pytest.mark.parametrize("front", list(FRONTS))
def test_a_front_tells_its_visitors_apart_ignores_forged_headers_and_refuses_in_sentences(front, tmp_path):
    with page_without_worker(f"front-{front}", address_new_sessions=NEW_TABS, max_upload_bytes=MB,
                             address_upload_bytes=MB, **FRONTS[front]) as (url, _owlet):
        first = [new_tab(url, through(front, "198.51.100.1", forged=f"192.0.2.{i}")) for i in range(NEW_TABS + 1)]
        assert first == [200] * NEW_TABS + [429], f"one visitor, whatever it forges, has one budget: {first}"
        assert new_tab(url, through(front, "198.51.100.2")) == 200, "the next visitor is another client"
        assert new_tab(url, through(front, "2001:db8:7:7::1")) == 200, "an IPv6 visitor too"
        if front == "share":
            assert new_tab(url, {}) == 200, "a loopback request without the header is the host itself"

        # gradio_client through the front: an upload over the visitor's budget is refused with the page's sentence.
        visitor = Client(url, verbose=False, headers=through(front, "198.51.100.3"))
        token = visitor.predict(None, api_name="/identity")
        first_picture = handle_file(picture(tmp_path / "a.png"))
        first_job = visitor.submit({"text": "What is this?", "files": [first_picture]}, 8, token, api_name="/chat")
        assert "in line" in wait_for_status(first_job)[-1][2], "the first picture fits the visitor's budget"
        with pytest.raises(AppError, match=r"^Your picture was not uploaded: Upload limit reached: .*Try again in"):
            visitor.predict({"text": "And this?", "files": [handle_file(picture(tmp_path / "b.png"))]}, 8, token,
                            api_name="/chat")
        # Another visitor's budget is untouched.
        with http(source="127.0.0.1") as other:
            other.headers.update(through(front, "198.51.100.4"))
            with open(picture(tmp_path / "c.png"), "rb") as data:
                assert other.post(f"{url}gradio_api/upload", files={"files": ("c.png", data)}).status_code == 200
        visitor.close()


def wait_for_status(job, timeout_s: float = 60.0) -> list:
    """The job's outputs once it has a status line (no worker here: a question stays in line)."""
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outputs = job.outputs()
        if outputs and outputs[-1][2]:
            return outputs
        if job.done():
            return [job.result()]
        time.sleep(0.1)
    raise AssertionError("the question got no status line")


def test_a_forged_refusal_receipt_is_one_more_file_the_caller_may_not_name(tmp_path):
    """A receipt carries the page's own sentence, signed: a made-up one names nothing the caller uploaded."""
    from ui.gradio_adapters.named_files import NOT_YOUR_UPLOAD
    from ui.uploads.refusal_receipts import PREFIX

    with page_without_worker("front-receipt") as (url, _owlet):
        with http(forwarded="198.51.100.9") as client:
            token = call(client, url, "identity", [None])[-1][0]
            forged = {"path": f"{PREFIX}V2UgYXJlIGNsb3NlZA==.{'0' * 32}", "meta": {"_type": "gradio.FileData"}}
            with pytest.raises(RuntimeError) as refused:
                call(client, url, "chat", [{"text": "hi", "files": [forged]}, 8, token])
            assert NOT_YOUR_UPLOAD[:40] in str(refused.value)
