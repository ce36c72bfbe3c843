"""Keys and shares, on a real page and Redis with no worker (every admitted answer stays queued, so caps hold
still): many keys from one address are one client; a waiting stream keeps its connection alive; with ``--auth``
only a login's key, given to a signed-in browser, opens the API."""
from __future__ import annotations

import contextlib
import json

import httpx
import pytest

from tests.security.attack import LIMITS
from tests.security.pages import page_without_worker

pytestmark = pytest.mark.timeout(120)


def key(url: str, http: httpx.Client | None = None) -> str:
    response = (http or httpx).get(url + "v1/key")
    assert response.status_code == 200 and response.headers["cache-control"] == "no-store"
    return response.json()["key"]


@contextlib.contextmanager
def open_stream(http: httpx.Client, url: str, key_: str, address: str | None = None):
    """A streamed question, held open; yields the response (its status read, its body not)."""
    headers = {"Authorization": f"Bearer {key_}", **({"X-Forwarded-For": address} if address else {})}
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "Hello?"}]}
    with http.stream("POST", url + "v1/chat/completions", json=body, headers=headers) as response:
        yield response


def test_many_keys_from_one_address_are_one_client():
    with page_without_worker("api-share", address_max_events=8, api_keepalive_s=0.5) as (url, client):
        with contextlib.ExitStack() as held, httpx.Client(timeout=30) as http:
            statuses, refusals = [], []
            for _ in range(LIMITS["group_jobs"] + 3):  # fresh keys, one address
                response = held.enter_context(open_stream(http, url, key(url), "203.0.113.7"))
                statuses.append(response.status_code)
                if response.status_code != 200:
                    refusals.append((response.headers.get("retry-after"), json.loads(response.read())["error"]))
            assert statuses.count(200) == LIMITS["group_jobs"], statuses
            assert all(retry and error["code"] == "address_cap" for retry, error in refusals), refusals
            elsewhere = held.enter_context(open_stream(http, url, key(url), "198.51.100.8"))
            assert elsewhere.status_code == 200, "another address still has its own share"
            groups = {client.r.hget(k, "group") for k in client.r.scan_iter(match=client.keys.prefix + "job:*")}
            assert groups == {b"addr:203.0.113.7", b"addr:198.51.100.8"}, groups


def test_a_waiting_stream_sends_its_first_chunk_then_keeps_alive():
    with page_without_worker("api-alive", api_keepalive_s=0.5) as (url, _client):
        with httpx.Client(timeout=30) as http, open_stream(http, url, key(url)) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            first = next(line for line in lines if line)
            assert json.loads(first[len("data: "):])["choices"][0]["delta"] == {"role": "assistant", "content": ""}
            assert next(line for line in lines if line) == ": keep-alive", "queued: the connection is kept alive"


def test_with_logins_only_a_signed_in_users_key_opens_the_api():
    with page_without_worker("api-auth", auth=(("alice", "wonderland"),)) as (url, _client):
        with httpx.Client(timeout=30) as http:
            assert http.get(url + "v1/key").status_code == 401, "no login, no key"
            anonymous = "v1." + "a" * 32 + "." + "b" * 32
            refused = http.get(url + "v1/models", headers={"Authorization": f"Bearer {anonymous}"})
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            assert http.post(url + "login", data={"username": "alice", "password": "wonderland"}).status_code < 400
            issued = http.get(url + "v1/key").json()
            assert issued["login"] == "alice" and issued["key"].startswith("l1.")
            elsewhere = http.get(url + "v1/key", headers={"Origin": "https://evil.example"})
            assert elsewhere.status_code == 403 and "key" not in elsewhere.json(), "no site but the page reads it"
        with httpx.Client(timeout=30) as api:  # no cookies: the key alone
            models = api.get(url + "v1/models", headers={"Authorization": f"Bearer {issued['key']}"})
            assert models.status_code == 200 and models.json()["object"] == "list"
            with open_stream(api, url, issued["key"]) as response:
                assert response.status_code == 200
            tampered = issued["key"].replace("l1." + "alice".encode().hex(), "l1." + "bob".encode().hex())
            assert api.get(url + "v1/models", headers={"Authorization": f"Bearer {tampered}"}).status_code == 401
