"""Helpers for driving the page through gradio_client and reading its /metrics."""
from __future__ import annotations

import re
import time
import urllib.request

from gradio_client import Client, handle_file

from ui.shared import wording

STACK_MAX_NEW_TOKENS = 96  # the stack's default answer length
METRICS_TOKEN = "test-metrics-token"  # the stack's OWLET_UI_METRICS_TOKEN
STACK_ENV = {  # the settings of the UI tests' stack (conftest), for its worker and its page
    "OWLET_UI_MAX_NEW_TOKENS": str(STACK_MAX_NEW_TOKENS), "OWLET_UI_MAX_NEW_TOKENS_CAP": "1500",
    "OWLET_UI_STALL_TIMEOUT_S": "60", "OWLET_UI_QUEUE_POLL_S": "0.5", "OWLET_HEARTBEAT_INTERVAL_S": "0.25",
    "OWLET_HEARTBEAT_TTL_S": "3", "OWLET_MAX_RUNNING": "16", "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN,
    "OWLET_UI_ADDRESS_MAX_EVENTS": "16", "OWLET_GROUP_JOB_CAP": "16", "OWLET_GROUP_SUBMIT_LIMIT": "500"}
STACK_WORKER_THREADS = 18


def bubble_text(message: dict) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def identity(client: Client) -> str:
    """This API client's identity token: asked for once from /identity (as the README tells API clients)."""
    if not getattr(client, "owlet_token", None):
        client.owlet_token = client.predict(None, api_name="/identity")
    return client.owlet_token


def submit(client: Client, text: str, image=None, max_new_tokens: int = STACK_MAX_NEW_TOKENS):
    """Start one turn through the page's /chat endpoint, with this client's identity token."""
    return client.submit({"text": text, "files": [handle_file(str(image))] if image else []}, max_new_tokens,
                         identity(client), api_name="/chat")


def ask(client: Client, text: str, image=None, max_new_tokens: int = STACK_MAX_NEW_TOKENS):
    """Run one turn; returns (every streamed output, the final output)."""
    job = submit(client, text, image, max_new_tokens)
    final = job.result(timeout=180)
    return job.outputs(), final


def wait_for_first_token(job, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        outs = job.outputs()
        if outs and outs[-1][1] and not bubble_text(outs[-1][1][-1]).startswith(wording.WAITING_MARK):
            return
        time.sleep(0.02)
    raise AssertionError("no token arrived")



def metrics_text(stack, token: str = METRICS_TOKEN) -> str:
    request = urllib.request.Request(stack.url + "metrics", headers={"Authorization": f"Bearer {token}"})
    return urllib.request.urlopen(request).read().decode()


def engine_running(text: str) -> float:
    """owlet_engine_running (all live workers together), from /metrics text."""
    return sum(float(m) for m in re.findall(r"^owlet_engine_running ([\d.]+)$", text, re.M))
