"""A client picks its own identity. Made-up ids are refused; real ones are free to mint, but
identities minted at one address share that address's caps and its one turn of the round robin."""
from __future__ import annotations


import pytest

from tests.redis_server import running_redis, unique_prefix
from tests.security.pages import page_without_worker
from tests.security.attack import LIMITS, Event, cancel_jobs, chat, http, identity, status_of, stored
from ui.shared import wording
from worker.client import OwletClient
from worker.config import Settings
from worker.heartbeat import Heartbeat, publish

pytestmark = pytest.mark.timeout(300)

IDENTITY_REFUSED = "could not tell who you are"


@pytest.mark.parametrize("forged", ["0" * 32, "3f2a9c0d5e7b41e8a6c2d9f0b1e4a7c3", "v1." + "a" * 32 + "." + "b" * 32, "user:alice",
                                    "session:abc"])
def test_made_up_identities_are_refused_and_store_nothing(stack, r, forged):
    before = stored(r, stack.prefix, "conv", "job", "img", "uq")
    with http(forwarded="203.0.113.10") as client:
        status = status_of(chat(client, stack.url, forged, "Who am I?"))
    assert IDENTITY_REFUSED in status, status
    assert stored(r, stack.prefix, "conv", "job", "img", "uq") == before


def test_identities_minted_at_one_address_share_its_cap(quiet_page):
    url, owlet = quiet_page
    attacker = "203.0.113.20"
    with http(forwarded=attacker) as client:
        tokens = [identity(client, url) for _ in range(6)]
    assert len(set(tokens)) == 6, "anyone may mint identities..."
    held = []
    try:
        for i, token in enumerate(tokens):  # one after another, each left open
            held.append(Event(url, "chat", [{"text": f"flood {i}", "files": []}, 16, token], forwarded=attacker))
            held[-1].status()
        statuses = [e.status() for e in held]
        admitted = [s for s in statuses if s.startswith(wording.WAITING_STARTS)]
        refused = [s for s in statuses if "from your network" in s]
        # ...but they all count against one address: one address's limits, not six users' worth
        assert len(admitted) == min(LIMITS["group_jobs"], LIMITS["events"]), statuses
        assert len(refused) == len(tokens) - len(admitted), statuses
        assert owlet.queue_stats()["queued"] == len(admitted)
        # a visitor at another address is admitted at once
        with http(forwarded="198.51.100.20") as client:
            honest = Event(url, "chat", [{"text": "Hello?", "files": []}, 16, identity(client, url)],
                           forwarded="198.51.100.20")
            assert honest.status().startswith(wording.WAITING_STARTS), honest.status()
            held.append(honest)
    finally:
        cancel_jobs(owlet)
        for e in held:
            e.done.wait(30)


def test_rotating_ipv6_addresses_within_one_network_share_its_cap(quiet_page):
    """One subscriber owns a whole /64 and may send every request from a fresh address in it."""
    url, owlet = quiet_page
    addresses = [f"2001:db8:77:1::{i + 1:x}" for i in range(6)]
    held = []
    try:
        for i, address in enumerate(addresses):
            with http(forwarded=address) as client:
                token = identity(client, url)
            held.append(Event(url, "chat", [{"text": f"rotate {i}", "files": []}, 16, token], forwarded=address))
            held[-1].status()
        statuses = [e.status() for e in held]
        admitted = [s for s in statuses if s.startswith(wording.WAITING_STARTS)]
        assert len(admitted) == min(LIMITS["group_jobs"], LIMITS["events"]), statuses
        assert all("from your network" in s for s in statuses if not s.startswith(wording.WAITING_STARTS)), statuses
        neighbour = "2001:db8:77:2::1"  # the next /64 is someone else, admitted at once
        with http(forwarded=neighbour) as client:
            other = Event(url, "chat", [{"text": "Hello?", "files": []}, 16, identity(client, url)], forwarded=neighbour)
        held.append(other)
        assert other.status().startswith(wording.WAITING_STARTS), other.status()
    finally:
        cancel_jobs(owlet)
        for e in held:
            e.done.wait(30)


def test_a_forwarded_header_from_an_untrusted_peer_counts_for_nothing(quiet_page):
    """A direct client (127.0.0.2, not a trusted proxy) cannot escape its address's cap by naming another."""
    url, owlet = quiet_page
    direct = "127.0.0.2"
    with http(source=direct) as client:
        tokens = [identity(client, url) for _ in range(LIMITS["group_jobs"] + 1)]
    held = [Event(url, "chat", [{"text": f"hold {i}", "files": []}, 16, t], source=direct)
            for i, t in enumerate(tokens[:-1])]
    try:
        assert all(e.status().startswith(wording.WAITING_STARTS) for e in held)
        with http(source=direct, forwarded="192.0.2.77") as client:
            status = status_of(chat(client, url, tokens[-1], "pretend I am someone else"))
        assert "from your network" in status, status
    finally:
        cancel_jobs(owlet)
        for e in held:
            e.done.wait(30)


def test_fifty_identities_at_one_address_get_one_addresses_turn():
    """The queue's order itself: 50 identities from one address, then 4 honest addresses, one job each."""
    with running_redis() as url:
        settings = Settings.from_env(redis_url=url, key_prefix=unique_prefix("sec-rr"), user_queue_cap=5,
                                     group_job_cap=100, group_submit_limit=1000, global_queue_cap=500)
        client = OwletClient(settings=settings)
        try:
            for i in range(50):
                client.submit(f"anon:forged{i}", None, f"flood {i}", group="addr:203.0.113.50")
            honest = [client.submit(f"anon:honest{i}", None, "hi", group=f"addr:198.51.100.{i}").job
                      for i in range(4)]
            assert [client.queue_position(j) for j in honest] == [2, 3, 4, 5], "each address gets one turn"
            publish(client.r, client.keys, Heartbeat(worker="idle@test", capacity=6), ttl_s=60)
            client.dispatch()
            assert all(client.job_state(j) == "dispatched" for j in honest), "dispatched in the first round"
        finally:
            client.close(purge=True)


def test_a_forwarded_header_from_loopback_counts_for_nothing_without_trusted_proxies():
    """uvicorn trusts X-Forwarded-For from 127.0.0.1 by default and rewrote the client address before Owlet's
    code ran: behind a tunnel or a TCP-mode TLS terminator, one forged header escaped every per-address limit.
    With no trusted proxies configured, a loopback client naming a new address per call is still one address."""
    from tests.security.test_tab_budget import new_tab_page

    with new_tab_page(trusted_proxies=(), address_new_sessions=2) as url:
        statuses = []
        for i in range(4):
            with http(source="127.0.0.1", forwarded=f"192.0.2.{i + 1}, nobody-{i}") as client:
                statuses.append(client.post(f"{url}gradio_api/call/identity", json={"data": [None]}).status_code)
        assert statuses == [200, 200, 429, 429], statuses


def test_the_browser_secret_is_sent_to_every_page_and_forges_nothing():
    """OWLET_UI_SECRET is Gradio's BrowserState key, which Gradio hands to every page it serves: so the docs call it
    no secret, and a visitor who reads it still cannot make an identity the page accepts."""
    with page_without_worker("browser-secret", secret="the-operators-own-browser-secret") as (url, _owlet):
        with http() as client:
            assert "the-operators-own-browser-secret" in client.get(f"{url}config").text
            status = status_of(chat(client, url, "v1." + "c" * 32 + ".the-operators-own-browser-secr", "Who am I?"))
    assert IDENTITY_REFUSED in status, status
