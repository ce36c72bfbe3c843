"""What an attacker (or an honest visitor) does to the page: raw HTTP calls of Gradio's API from a chosen
source address, or through the trusted proxy with a chosen ``X-Forwarded-For``, and gradio_client clients."""
from __future__ import annotations

import io
import json
import random

import httpx
from gradio_client import Client, handle_file
from PIL import Image

from ui.shared import wording

METRICS_TOKEN = "security-metrics-token"
LIMITS = {"events": 2, "group_jobs": 2, "upload_bytes": 2 * 1024 * 1024}
LONG = 1500  # tokens: an answer that runs for a while, so it holds its slot during the test


def http(source: str = "127.0.0.1", forwarded: str | None = None, timeout: float = 120) -> httpx.Client:
    """An HTTP client whose connections come from ``source``; ``forwarded`` is sent as X-Forwarded-For."""
    headers = {"X-Forwarded-For": forwarded} if forwarded else {}
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), headers=headers, timeout=timeout)


def private_picture() -> bytes:
    """A small PNG of a random colour: bytes nobody else has uploaded."""
    out = io.BytesIO()
    Image.new("RGB", (64, 64), tuple(random.randrange(256) for _ in range(3))).save(out, format="PNG")
    return out.getvalue()


def upload(base: str, address: str, data: bytes, name: str) -> str:
    """Upload ``data`` as the client at ``address`` (through the trusted proxy); returns the stored path."""
    with http(forwarded=address) as client:
        response = client.post(base + "gradio_api/upload", files={"files": (name, data, "image/png")})
    response.raise_for_status()
    (path,) = response.json()
    return path


def uploaded_by_both(base: str, victim: str, stranger: str, probe_name: str) -> tuple[bytes, str, str, str]:
    """The victim uploads a private picture as ``image.png``, then the stranger uploads the same bytes as
    ``probe_name``: same bytes, same folder, so the stranger can spell the victim's path. Returns the bytes, the
    victim's path, the stranger's and their folder."""
    data = private_picture()
    victims = upload(base, victim, data, "image.png")
    probe = upload(base, stranger, data, probe_name)
    folder = probe.rsplit("/", 1)[0]
    assert victims == f"{folder}/image.png", "same bytes, same folder: the stranger can name the victim's file"
    return data, victims, probe, folder


def call(client: httpx.Client, base: str, api: str, data: list, stream: bool = True) -> list:
    """Run one API event through ``/gradio_api/call``; returns every data payload it streamed, in order."""
    response = client.post(f"{base}gradio_api/call/{api}", json={"data": data})
    response.raise_for_status()
    event_id = response.json()["event_id"]
    payloads = []
    with client.stream("GET", f"{base}gradio_api/call/{api}/{event_id}") as events:
        kind = None
        for line in events.iter_lines():
            if line.startswith("event:"):
                kind = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                payload = json.loads(line.split(":", 1)[1])
                if kind == "error":
                    raise RuntimeError(f"the page failed the event: {payload}")
                payloads.append(payload)
                if kind == "complete":
                    break
    return payloads


def identity(client: httpx.Client, base: str) -> str:
    return call(client, base, "identity", [None])[-1][0]


def chat(client: httpx.Client, base: str, token, text: str, tokens: int = 16) -> list:
    return call(client, base, "chat", [{"text": text, "files": []}, tokens, token])


def status_of(payloads: list) -> str:
    """The status line of the last update (outputs: box, chat, status)."""
    return payloads[-1][2]


def gradio_client(base: str, forwarded: str) -> Client:
    """A gradio_client through the trusted proxy, as the client at ``forwarded``, with its identity token."""
    client = Client(base, verbose=False, headers={"X-Forwarded-For": forwarded})
    client.owlet_token = client.predict(None, api_name="/identity")
    return client


def ask(client: Client, text: str, image=None, tokens: int = 16):
    return client.submit({"text": text, "files": [handle_file(str(image))] if image else []}, tokens,
                         client.owlet_token, api_name="/chat")


def stored(r, prefix: str, *kinds: str) -> set[bytes]:
    """Keys of the given kinds (img, conv, job, uq, stream, quota) under the stack's prefix."""
    return {k for kind in kinds for k in r.scan_iter(match=f"{prefix}{kind}:*", count=1000)}


class Event:
    """One API event run on a thread (its stream kept open), so a test can hold several at once."""

    def __init__(self, base: str, api: str, data: list, source: str = "127.0.0.1", forwarded: str | None = None):
        import threading

        self.payloads: list = []
        self.error: Exception | None = None
        self.first = threading.Event()
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base, api, data, source, forwarded), daemon=True)
        self._thread.start()

    def _run(self, base, api, data, source, forwarded):
        try:
            with http(source, forwarded, timeout=300) as client:
                response = client.post(f"{base}gradio_api/call/{api}", json={"data": data})
                event_id = response.json()["event_id"]
                with client.stream("GET", f"{base}gradio_api/call/{api}/{event_id}") as events:
                    kind = None
                    for line in events.iter_lines():
                        if line.startswith("event:"):
                            kind = line.split(":", 1)[1].strip()
                        elif line.startswith("data:") and kind == "error":
                            raise RuntimeError(f"the page failed the event: {line}")
                        elif line.startswith("data:") and kind in ("generating", "complete"):
                            self.payloads.append(json.loads(line.split(":", 1)[1]))
                            self.first.set()
                            if kind == "complete":
                                break
        except Exception as exc:  # surfaced by status()
            self.error = exc
        finally:
            self.first.set()
            self.done.set()

    def status(self, timeout: float = 60) -> str:
        """The latest status line, once there is one."""
        assert self.first.wait(timeout), "the event produced nothing"
        assert self.error is None and self.payloads, f"the event failed: {self.error!r}"
        return self.payloads[-1][2]


def cancel_jobs(client) -> None:
    """End every job still waiting or running in an OwletClient's namespace (test clean-up)."""
    for key in client.r.scan_iter(match=client.keys.job("*"), count=1000):
        client.jobs.cancel(key.decode()[len(client.keys.job("")):])


def assert_can_still_ask(base: str, owlet, token: str, forwarded: str) -> None:
    """After a refused attempt, the same caller's plain question is queued (nothing was left locked or spent
    wrongly); then every job is ended again."""
    honest = Event(base, "chat", [{"text": "hello?", "files": []}, 16, token], forwarded=forwarded)
    try:
        assert honest.status().startswith(wording.WAITING_STARTS), "the same caller can still ask a plain question"
    finally:
        cancel_jobs(owlet)
        honest.done.wait(30)


def stack_client(stack):
    """An OwletClient on the stack's namespace (close it after use)."""
    from worker.client import OwletClient
    from worker.config import Settings

    return OwletClient(settings=Settings.from_env(redis_url=stack.redis_url, key_prefix=stack.prefix))


def cancel_everything(stack) -> None:
    """End every job still waiting or running in the stack's namespace (test clean-up)."""
    client = stack_client(stack)
    try:
        cancel_jobs(client)
    finally:
        client.close()
