"""Fixtures for UI tests: one real stack (Redis, worker with a tiny model, page) shared by the session."""
from __future__ import annotations

import pytest

from tests.ui.page_client import METRICS_TOKEN, STACK_MAX_NEW_TOKENS
from tests.ui.stack import running_stack, tiny_model


@pytest.fixture(scope="session")
def stack():
    env = {"OWLET_UI_MAX_NEW_TOKENS": str(STACK_MAX_NEW_TOKENS), "OWLET_UI_MAX_NEW_TOKENS_CAP": "1500",
           "OWLET_UI_STALL_TIMEOUT_S": "60", "OWLET_UI_QUEUE_POLL_S": "0.5", "OWLET_HEARTBEAT_INTERVAL_S": "0.25",
           "OWLET_HEARTBEAT_TTL_S": "3", "OWLET_MAX_RUNNING": "16",
           "OWLET_UI_METRICS_TOKEN": METRICS_TOKEN, "OWLET_UI_ADDRESS_MAX_EVENTS": "16",
           "OWLET_GROUP_JOB_CAP": "16", "OWLET_GROUP_SUBMIT_LIMIT": "500"}
    with running_stack("ui", tiny_model(), env, worker_concurrency=18) as s:
        yield s


@pytest.fixture(scope="module")
def chromium():
    """Headless Chromium (the machine's, driven by the pip playwright package); tests open their own tabs in it."""
    from playwright.sync_api import sync_playwright

    from tests.ui.test_browser import CHROMIUM, LAUNCH_ARGS

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser
        finally:
            browser.close()
