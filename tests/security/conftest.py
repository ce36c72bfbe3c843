"""One real stack for the attack tests: Redis, a Celery worker (tiny model) and the page, configured as a
public deployment behind one trusted proxy (127.0.0.1) with small per-address limits, so each attack
reaches its limit in a few calls.

Distinct clients: through the trusted proxy a client is whatever ``X-Forwarded-For`` names (the test plays
the proxy); a direct client is a loopback source address (127.0.0.2, 127.0.0.3, ...) whose own forwarding
headers count for nothing.
"""
from __future__ import annotations

import pytest

from tests.security.attack import LIMITS, METRICS_TOKEN
from tests.security.pages import page_without_worker
from tests.ui.stack import TEST_STACK_ENV, endless_tiny_model, running_stack, stack_redis


@pytest.fixture(scope="package")
def stack():
    env = {"OWLET_UI_MAX_NEW_TOKENS": "16", "OWLET_UI_MAX_NEW_TOKENS_CAP": "1500",
           **TEST_STACK_ENV, "OWLET_MAX_RUNNING": "4",
           "OWLET_UI_TRUSTED_PROXIES": "127.0.0.1", "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN,
           "OWLET_UI_ADDRESS_MAX_EVENTS": str(LIMITS["events"]), "OWLET_GROUP_JOB_CAP": str(LIMITS["group_jobs"]),
           "OWLET_UI_MAX_UPLOAD_BYTES": str(LIMITS["upload_bytes"]),
           # each attack meets its refusals on purpose; the brake on them has its own test (test_refusal_brake)
           "OWLET_UI_ADDRESS_REFUSALS": "100000"}
    # answers run to their length (no EOS), so a long one is still running when an attack acts on it
    with running_stack("security", endless_tiny_model(), env, worker_concurrency=6) as s:
        yield s


@pytest.fixture
def r(stack):
    with stack_redis(stack) as client:
        yield client


@pytest.fixture
def quiet_page():
    """A real page on a real Redis with no worker: every admitted job stays queued and its answer stream
    stays open, so holding slots and caps is deterministic. Yields (url, OwletClient)."""
    with page_without_worker("sec-quiet", address_max_events=LIMITS["events"], metrics_token=METRICS_TOKEN,
                             max_upload_bytes=LIMITS["upload_bytes"]) as (url, client):
        yield url, client
