"""New Gradio sessions per client address (ui.edge.tab_budget).

Gradio keeps each session's state in an LRU of 10,000 sessions, and every request with an unseen session hash
(or an API call without one) adds an entry: a stranger making ten thousand cheap calls pushed every visitor's
tab state out, and their next question silently started a new conversation."""
from __future__ import annotations

import contextlib

import httpx
import pytest
from gradio_client import Client

from tests.fake_clock import FakeClock
from tests.redis_server import running_redis, unique_prefix
from tests.security.attack import call, http, identity
from tests.ui.stack import free_port, launched_page
from ui.config import UIConfig
from ui.edge.tab_budget import NewTabLedger

pytestmark = pytest.mark.timeout(180)


@contextlib.contextmanager
def new_tab_page(**config):
    """A page with no worker on a real Redis, configured with ``config``; yields its URL."""
    with running_redis() as redis_url:
        ui_config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("sessions"), **config)
        with launched_page(ui_config) as (url, _client):
            yield url


def test_ledger_counts_new_sessions_per_address_and_never_a_known_one():
    clock = FakeClock()
    ledger = NewTabLedger(per_address=2, window_s=60, clock=clock)
    assert ledger.admit("a", "tab-1") is None
    clock.now += 10
    assert ledger.admit("a", None) is None, "a call without a session hash opens one too"
    assert ledger.admit("a", "tab-2") == pytest.approx(50), "the third new one waits for the first to age out"
    assert ledger.admit("a", "tab-1") is None, "a session in use is never refused"
    assert ledger.admit("b", "tab-9") is None, "another address has its own budget"
    clock.now += 50
    assert ledger.admit("a", "tab-2") is None, "the first left the window"
    assert ledger.admit("a", "tab-1") is None


def test_ledger_forgets_idle_addresses():
    clock = FakeClock()
    ledger = NewTabLedger(per_address=1, window_s=60, clock=clock)
    for i in range(100):
        assert ledger.admit(f"10.0.0.{i}", "s") is None
    clock.now += 61
    assert ledger.admit("10.0.1.1", "s") is None
    assert set(ledger._opened) == {"10.0.1.1"} and set(ledger._known) <= {"10.0.1.1"}


def test_a_flood_of_new_sessions_from_one_address_is_refused_and_others_keep_theirs():
    with running_redis() as redis_url:
        config = UIConfig(port=free_port(), redis_url=redis_url, key_prefix=unique_prefix("sessions"),
                          trusted_proxies=("127.0.0.1",), address_new_sessions=3)
        with launched_page(config) as (url, _client):
            visitor = Client(url, verbose=False, headers={"X-Forwarded-For": "198.51.100.7"})
            token = visitor.predict(None, api_name="/identity")  # the visitor's one session
            flood = http(forwarded="203.0.113.9")
            for _ in range(3):
                assert identity(flood, url).startswith("v1."), "within the budget, each call is served"
            refused = flood.post(f"{url}gradio_api/call/identity", json={"data": [None]})
            assert refused.status_code == 429 and refused.text.startswith("Too many new sessions from your network")
            assert 1 <= int(refused.headers["retry-after"]) <= 600
            joined = flood.post(f"{url}gradio_api/queue/join",
                                json={"data": [None], "fn_index": 0, "session_hash": "fresh-hash-1"})
            assert joined.status_code == 429, "through the queue too"
            for _ in range(5):  # the visitor's session is known: never refused, however many calls
                assert visitor.predict(token, api_name="/identity") == token
            other = Client(url, verbose=False, headers={"X-Forwarded-For": "192.0.2.44"})
            assert other.predict(None, api_name="/identity").startswith("v1."), "another address is not affected"
            assert httpx.get(url + "gradio_api/info", timeout=10).status_code == 200
            call(http(forwarded="198.51.100.8"), url, "identity", [None])  # and new visitors still come in
