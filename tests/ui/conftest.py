"""Fixtures for UI tests: one real stack (Redis, worker with a tiny model, page) shared by the tests of tests/ui/, and
one beside it, started only for the tests that ask, whose model never says EOS. Both are package-scoped: stopped
after the package's last test, instead of idling (polling Redis) through the rest of the suite."""
from __future__ import annotations

import pytest

from tests.ui.page_client import STACK_ENV, STACK_WORKER_THREADS
from tests.ui.stack import endless_tiny_model, running_stack, tiny_model


@pytest.fixture(scope="package")
def stack():
    with running_stack("ui", tiny_model(), STACK_ENV, worker_concurrency=STACK_WORKER_THREADS) as s:
        yield s


@pytest.fixture(scope="package")
def endless_stack():
    """The same stack serving the tiny model with its EOS logit pinned at 0, so every answer runs to its length
    limit: for tests that need an answer to last (batching, Stop mid-answer). The random model's own answers often
    end after a few dozen tokens, in well under a second."""
    with running_stack("endless", endless_tiny_model(), STACK_ENV, worker_concurrency=STACK_WORKER_THREADS) as s:
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
