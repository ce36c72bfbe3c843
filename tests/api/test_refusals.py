"""What the API refuses, against a real stack, by raw HTTP and through the official ``openai`` package: each is an
OpenAI error object with the right status and a sentence, and nothing of a refused request is stored."""
from __future__ import annotations

import base64
import io
import json
import os

import httpx
import openai
import pytest
from PIL import Image

from tests.api.conftest import (MAX_API_BYTES, MAX_TEXT_CHARS, MAX_UPLOAD_BYTES, data_url, new_key, openai_client,
                                user_data)
from tests.ui.stack import tiny_model
from ui.api.chat_request import NO_URLS

pytestmark = pytest.mark.timeout(120)


def post(stack, body: dict | bytes, key: str | None = None, headers: dict | None = None) -> httpx.Response:
    headers = {**({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    return httpx.post(stack.url + "v1/chat/completions", headers=headers, timeout=60, **kwargs)


def asking(picture_url: str | None = None, text: str = "What is it?", **fields) -> dict:
    content = [{"type": "text", "text": text}]
    if picture_url:
        content.append({"type": "image_url", "image_url": {"url": picture_url}})
    return {"model": tiny_model().name, "messages": [{"role": "user", "content": content}], "max_tokens": 4, **fields}


def noise_png(size: int) -> bytes:
    """A PNG of random pixels of about ``size`` bytes (noise does not compress)."""
    side = int((size / 3) ** 0.5) + 1
    out = io.BytesIO()
    Image.frombytes("RGB", (side, side), os.urandom(side * side * 3)).save(out, format="PNG")
    return out.getvalue()


def refused(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, (response.status_code, response.text[:300])
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["message"] and error["type"], error
    assert "Traceback" not in response.text
    return error


def escaped(body: dict) -> bytes:
    """``body`` as JSON with every non-ASCII character escaped: an unpaired surrogate travels as "\\ud800", as a
    hand-made request (or a client's broken string) sends it; httpx's ``json=`` cannot encode one at all."""
    return json.dumps(body).encode("ascii")


JSON = {"Content-Type": "application/json"}


@pytest.mark.parametrize("case", ["forged key", "http picture", "n=2", "oversized base64", "bad base64",
                                  "text over the limit", "tools", "unknown parameter", "unpaired surrogate",
                                  "unpaired surrogate in a stop sequence"])
def test_refusals_say_why_and_store_nothing(stack, case):
    key = new_key(stack.url)
    forged = key[:-4] + ("0000" if not key.endswith("0000") else "1111")
    big = data_url(noise_png(MAX_UPLOAD_BYTES + 4096))
    cases = {
        "forged key": (lambda: post(stack, asking(), forged), 401, "not valid"),
        "http picture": (lambda: post(stack, asking("https://example.org/cat.png"), key), 400, NO_URLS),
        "n=2": (lambda: post(stack, asking(n=2), key), 400, "n must be 1"),
        "oversized base64": (lambda: post(stack, asking(big), key), 413, "; the limit is"),
        "bad base64": (lambda: post(stack, asking("data:image/png;base64,%%%%not*base64"), key), 400, "base64"),
        "text over the limit": (lambda: post(stack, asking(text="x" * (MAX_TEXT_CHARS + 1)), key), 400,
                                f"longer than {MAX_TEXT_CHARS} characters"),
        "tools": (lambda: post(stack, asking(tools=[{"type": "function", "function": {"name": "f"}}]), key), 400,
                  "does not call tools"),
        "unknown parameter": (lambda: post(stack, asking(guided_json={}), key), 400, "guided_json"),
        "unpaired surrogate": (lambda: post(stack, escaped(asking(text="What is it?\ud800")), key, JSON), 400,
                               "Your question holds a character that is not text (an unpaired surrogate, U+D800"),
        "unpaired surrogate in a stop sequence": (
            lambda: post(stack, escaped(asking(stop=["\udc00"])), key, JSON), 400,
            "A stop sequence holds a character that is not text (an unpaired surrogate, U+DC00"),
    }
    send, status, words = cases[case]
    before = user_data(stack)
    error = refused(send(), status)
    assert words in error["message"], error
    assert user_data(stack) == before, "a refused request stores nothing"


def test_a_picture_that_is_not_an_image_is_refused_as_the_page_refuses_an_upload(stack):
    before = user_data(stack)
    fake = base64.b64encode(b"definitely not a png" * 50).decode()
    error = refused(post(stack, asking(f"data:image/png;base64,{fake}"), new_key(stack.url)), 400)
    assert error["message"].startswith("This file is not an image we can read"), error
    assert user_data(stack) == before


def test_the_edge_refusals_of_api_routes_are_openai_error_objects(stack):
    key = new_key(stack.url)
    too_big = post(stack, b'{"model": "m", "messages": [], "pad": "' + b"x" * MAX_API_BYTES + b'"}', key,
                   {"Content-Type": "application/json"})
    assert refused(too_big, 413)["code"] == "request_too_large"
    unknown = httpx.post(stack.url + "v1/completions", json={"prompt": "hi"}, headers={"Authorization": f"Bearer {key}"})
    assert "/v1/chat/completions" in refused(unknown, 404)["message"]
    assert refused(post(stack, b"{not json", key, {"Content-Type": "application/json"}), 400)["code"] == "invalid_json"


def test_the_openai_package_raises_its_own_error_for_each_status(stack):
    client = openai_client(stack)
    with pytest.raises(openai.AuthenticationError):
        openai_client(stack, key="v1." + "0" * 32 + "." + "0" * 32).models.list()
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], n=2)
    assert "n must be 1" in bad.value.message
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.code == "model_not_found"
