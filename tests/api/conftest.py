"""Fixtures for the OpenAI-compatible API's tests: one real stack (Redis, a worker serving the tiny LFM2-VL in fp32,
the page) shared by the tests of tests/api/ (package-scoped: stopped after the last of them), and helpers to reach
it with the official ``openai`` package and with raw HTTP.

fp32, so an answer's tokens never depend on what else the worker batches with it: the API's answers can be
compared with the page's. The page trusts 127.0.0.1 as its proxy, so a test plays clients at other addresses with
``X-Forwarded-For``.
"""
from __future__ import annotations

import base64

import httpx
import openai
import pytest

from tests.ui.stack import TEST_STACK_ENV, running_stack, stack_redis, tiny_model

METRICS_TOKEN = "api-metrics-token"
MAX_TEXT_CHARS = 200
MAX_UPLOAD_BYTES = 256 * 1024
MAX_API_BYTES = 1024 * 1024
ANSWER_TOKENS = 24


@pytest.fixture(scope="package")
def stack():
    env = {**TEST_STACK_ENV, "OWLET_DTYPE": "float32", "OWLET_UI_MAX_NEW_TOKENS": str(ANSWER_TOKENS),
           "OWLET_UI_MAX_NEW_TOKENS_CAP": "1500", "OWLET_MAX_RUNNING": "4",
           "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN, "OWLET_UI_TRUSTED_PROXIES": "127.0.0.1",
           "OWLET_UI_ADDRESS_MAX_EVENTS": "8", "OWLET_GROUP_JOB_CAP": "8", "OWLET_GROUP_SUBMIT_LIMIT": "500",
           "OWLET_UI_MAX_TEXT_CHARS": str(MAX_TEXT_CHARS), "OWLET_UI_MAX_UPLOAD_BYTES": str(MAX_UPLOAD_BYTES),
           "OWLET_UI_API_MAX_REQUEST_BYTES": str(MAX_API_BYTES),
           # the tests meet many refusals on purpose, from few addresses: no brake (tests/security/test_refusal_brake)
           "OWLET_UI_ADDRESS_REFUSALS": "100000"}
    with running_stack("api", tiny_model(), env, worker_concurrency=8) as s:
        yield s



def new_key(base_url: str) -> str:
    """A fresh anonymous key from GET /v1/key, as the README tells API clients."""
    response = httpx.get(base_url + "v1/key")
    response.raise_for_status()
    return response.json()["key"]


def openai_client(stack, key: str | None = None, address: str | None = None) -> openai.OpenAI:
    """The official client, pointed at the stack (as a client at ``address``, through the trusted proxy)."""
    headers = {"X-Forwarded-For": address} if address else None
    return openai.OpenAI(base_url=stack.url + "v1", api_key=key or new_key(stack.url), default_headers=headers,
                         max_retries=0, timeout=180)


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def user_data(stack) -> set[bytes]:
    """Every key a turn stores in the stack's namespace (pictures, conversations, jobs, queues, streams, the API's
    index)."""
    with stack_redis(stack) as r:
        return {k for kind in ("img", "conv", "job", "uq", "stream", "chatidx")
                for k in r.scan_iter(match=f"{stack.prefix}{kind}:*", count=1000)}
