"""Fixtures for UI tests: one real stack (Redis, worker with a tiny model, page) shared by the session."""
from __future__ import annotations

import pytest

from tests.ui.page_client import STACK_ENV, STACK_WORKER_THREADS
from tests.ui.stack import running_stack, tiny_model


@pytest.fixture(scope="session")
def stack():
    with running_stack("ui", tiny_model(), STACK_ENV, worker_concurrency=STACK_WORKER_THREADS) as s:
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
