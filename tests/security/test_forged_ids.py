"""Attack 1: a client picks its own identity. Made-up ids are refused; real ones are free to mint, but
identities minted at one address share that address's caps and its one turn of the round robin."""
from __future__ import annotations

import time
import uuid

import pytest

from tests.security.attack import (LIMITS, LONG, Event, cancel_everything, chat, gradio_client, http, identity,
                                   status_of, stored)
from tests.redis_server import running_redis, unique_prefix
from worker.client import OwletClient
from worker.config import Settings
from worker.heartbeat import Heartbeat, publish

pytestmark = pytest.mark.timeout(300)

IDENTITY_REFUSED = "could not tell who you are"


@pytest.mark.parametrize("forged", ["0" * 32, uuid.uuid4().hex, "v1." + "a" * 32 + "." + "b" * 32, "user:alice",
                                    "session:abc"])
def test_made_up_identities_are_refused_and_store_nothing(stack, r, forged):
    before = stored(r, stack.prefix, "conv", "job", "img", "uq")
    with http(forwarded="203.0.113.10") as client:
        status = status_of(chat(client, stack.url, forged, "Who am I?"))
    assert IDENTITY_REFUSED in status, status
    assert stored(r, stack.prefix, "conv", "job", "img", "uq") == before


def test_identities_minted_at_one_address_share_its_cap(stack, r):
    attacker = "203.0.113.20"
    with http(forwarded=attacker) as client:
        tokens = [identity(client, stack.url) for _ in range(6)]
    assert len(set(tokens)) == 6, "anyone may mint identities..."
    events = [Event(stack.url, "chat", [{"text": f"flood {i}", "files": []}, LONG, t], forwarded=attacker)
              for i, t in enumerate(tokens)]
    try:
        statuses = [e.status() for e in events]
        admitted = [s for s in statuses if s.startswith(("Queued", "Thinking")) or not s]
        refused = [s for s in statuses if "from your network" in s]
        # ...but they all count against one address: the per-address limits, not six users' worth
        assert len(admitted) <= LIMITS["group_jobs"], statuses
        assert len(refused) == len(tokens) - len(admitted), statuses
        # an honest visitor at another address is answered meanwhile
        honest = gradio_client(stack.url, "198.51.100.20")
        job = honest.submit({"text": "Hello?", "files": []}, 16, honest.owlet_token, api_name="/chat")
        _box, _chat, status = job.result(timeout=120)
        assert "First token" in status, status
    finally:
        cancel_everything(stack)
        for e in events:
            e.done.wait(60)


def test_a_forwarded_header_from_an_untrusted_peer_counts_for_nothing(stack):
    """A direct client (127.0.0.2, not a trusted proxy) cannot escape its address's cap by naming another."""
    direct = "127.0.0.2"
    with http(source=direct) as client:
        tokens = [identity(client, stack.url) for _ in range(LIMITS["group_jobs"] + 1)]
    events = [Event(stack.url, "chat", [{"text": f"hold {i}", "files": []}, LONG, t], source=direct)
              for i, t in enumerate(tokens[:-1])]
    try:
        for e in events:
            e.status()
        time.sleep(0.5)
        with http(source=direct, forwarded="192.0.2.77") as client:
            status = status_of(chat(client, stack.url, tokens[-1], "pretend I am someone else"))
        assert "from your network" in status, status
    finally:
        cancel_everything(stack)
        for e in events:
            e.done.wait(60)


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
