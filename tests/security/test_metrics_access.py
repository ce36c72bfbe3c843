"""/metrics and /healthz could leak identities, addresses and worker names. Now /metrics needs the bearer
token and carries aggregates with bounded labels only; /healthz tells strangers ok or not; with --auth,
nothing but the login page and /healthz answers without a login."""
from __future__ import annotations

import re

import httpx
import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.security.attack import METRICS_TOKEN, ask, gradio_client
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig

pytestmark = pytest.mark.timeout(300)

# Every label a scrape may carry, and every value it may take: nothing that grows with traffic.
ALLOWED_LABELS = {"outcome", "kind", "reason", "result", "le", "quantile"}


def test_metrics_need_the_token_and_name_nobody(stack):
    client = gradio_client(stack.url, "198.51.100.41")
    _box, _chat, status = ask(client, "Count the shapes.").result(timeout=120)
    assert "Answered in" in status
    assert httpx.get(stack.url + "metrics").status_code == 401
    assert httpx.get(stack.url + "metrics", headers={"Authorization": "Bearer guess"}).status_code == 401
    text = httpx.get(stack.url + "metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text
    assert "owlet_num_requests_waiting" in text and "owlet_workers_alive 1.0" in text
    labels = set(re.findall(r'[{,]([a-z_]+)="', text))
    assert labels <= ALLOWED_LABELS, labels - ALLOWED_LABELS
    for secret in ("anon:", "addr:", "198.51.100.41", client.session_hash, client.owlet_token, "@"):
        assert secret not in text, secret


def test_healthz_says_only_ok_to_strangers(stack):
    assert httpx.get(stack.url + "healthz").json() == {"ok": True}
    detail = httpx.get(stack.url + "healthz", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).json()
    assert detail["ok"] and len(detail["workers"]) == 1


@pytest.fixture
def page_with_login():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("sec-auth"),
                          auth=(("alice", "wonderland"),), metrics_token=METRICS_TOKEN)
        with launched_page(config) as (url, _client):
            yield url


def test_with_auth_nothing_but_login_and_healthz_answers(page_with_login):
    url = page_with_login
    closed = [("GET", "config"), ("GET", "gradio_api/info"), ("POST", "gradio_api/upload"),
              ("POST", "gradio_api/queue/join"), ("POST", "gradio_api/call/chat"), ("POST", "gradio_api/call/identity"),
              ("POST", "gradio_api/cancel"), ("GET", "gradio_api/heartbeat/x"),
              ("GET", "metrics"), ("GET", "gradio_api/file=/etc/hostname")]
    for method, path in closed:
        response = httpx.request(method, url + path, json={} if method == "POST" else None, timeout=10)
        assert response.status_code in (401, 403), (path, response.status_code, response.text[:200])
    # Prometheus has no login: the metrics token alone is enough, as docs/security.md's scrape configuration sends it
    scraped = httpx.get(url + "metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10)
    assert scraped.status_code == 200 and "owlet_redis_up 1.0" in scraped.text, scraped.text[:300]
    # routes the page never uses (ui/edge/public_routes.py) are closed to everyone, logged in or not
    assert httpx.get(url + "openapi.json", timeout=10).status_code == 404
    assert httpx.get(url + "healthz", timeout=10).json() == {"ok": False}  # no worker here; and no detail
    assert httpx.get(url, timeout=10).status_code == 200, "the login page itself"
    with httpx.Client(base_url=url, timeout=10) as browser:
        assert browser.post("login", data={"username": "alice", "password": "wonderland"}).status_code == 200
        assert browser.get("config").status_code == 200, "a login opens the page"


def test_with_auth_one_address_cannot_try_passwords_at_network_speed():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("sec-login"),
                          auth=(("alice", "wonderland"),), trusted_proxies=("127.0.0.1",), address_logins=5)
        with launched_page(config) as (url, _client):
            guesser = httpx.Client(base_url=url, timeout=10, headers={"X-Forwarded-For": "203.0.113.66"})
            tries = [guesser.post("login", data={"username": "alice", "password": f"guess{i}"}).status_code
                     for i in range(5)]
            assert 429 not in tries and 200 not in tries, tries
            refused = guesser.post("login", data={"username": "alice", "password": "wonderland"})
            assert refused.status_code == 429, "even the right password waits once the budget is spent"
            assert refused.text.startswith("Too many sign-in attempts") and int(refused.headers["retry-after"]) > 0
            multipart = guesser.post("login", files={"username": (None, "alice"), "password": (None, "x")})
            assert multipart.status_code == 429, "a multipart form names the account too"
            for spaced in (" alice", "alice ", "\talice", "alice\n"):  # Gradio strips the name: the same account
                assert guesser.post("login", data={"username": spaced, "password": "x"}).status_code == 429, spaced
            assert guesser.post("login", data={"username": "bob", "password": "x"}).status_code != 429, \
                "other accounts at that address are not locked out"
            with httpx.Client(base_url=url, timeout=10, headers={"X-Forwarded-For": "198.51.100.66"}) as alice:
                assert alice.post("login", data={"username": "alice", "password": "wonderland"}).status_code == 200
            # A new name each time: the address's total over all names (5 x 5) still applies. 12 attempts came
            # before (5 guesses, 6 refused for alice, 1 for bob), so 13 more pass.
            made_up = [guesser.post("login", data={"username": f"nobody{i}", "password": "x"}).status_code
                       for i in range(20)]
            assert 429 not in made_up[:13] and set(made_up[13:]) == {429}, made_up
            guesser.close()


def test_with_auth_prometheus_scrapes_with_the_shipped_configuration(page_with_login, tmp_path):
    """Prometheus has no login: with --auth, the scrape configuration the `monitoring` profile ships (and
    docs/security.md quotes) reaches /metrics with the bearer token alone."""
    from urllib.parse import urlparse

    from tests.deploy.prometheus_on_host import query, running_prometheus, wait_until_scraped

    page = urlparse(page_with_login)
    with running_prometheus({"owlet-ui": [f"{page.hostname}:{page.port}"]},
                            {"OWLET_UI_METRICS_TOKEN": METRICS_TOKEN}, tmp_path) as prometheus:
        wait_until_scraped(prometheus, {"owlet-ui": 1})
        assert query(prometheus, "owlet_redis_up")[0]["value"][1] == "1"
