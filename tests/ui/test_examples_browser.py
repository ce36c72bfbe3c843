"""The page's clickable examples, in a real browser, against a real stack serving the bundled demo model.

The shared UI stack serves a tiny random model whose words mean nothing, so this module starts its own stack
with models/owlet-shapes-vl: clicking an example must fill the box with its picture and question, and sending
it must give the right answer (the scene's ground truth, training/example_scenes.py).
"""
from __future__ import annotations

import os

import pytest

from tests.ui.stack import ARTIFACTS, running_stack
from tests.ui.test_browser import BOT, CHROMIUM, LAUNCH_ARGS, USER, ask
from training.demo_model import DEFAULT_MODEL_DIR
from training.example_scenes import EXAMPLES

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]


@pytest.fixture(scope="module")
def demo_stack():
    env = {"OWLET_HEARTBEAT_INTERVAL_S": "0.25", "OWLET_HEARTBEAT_TTL_S": "3"}
    with running_stack("ui-examples", DEFAULT_MODEL_DIR, env, worker_concurrency=4) as stack:
        yield stack


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        yield browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
        browser.close()


def test_clicking_an_example_gets_the_right_answer(demo_stack, page):
    page.goto(demo_stack.url)
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    assert "knows only coloured shapes" in page.locator("#owlet-how").inner_text(), "said in the first view"
    page.locator("#owlet-about").click()  # and, on demand, what it can answer
    page.wait_for_function("document.querySelector('#owlet-about').innerText.includes('simple pictures of coloured "
                           "shapes')", timeout=10_000)
    samples = page.locator("#owlet-examples .gallery-item, #owlet-examples tr.tr-body, #owlet-examples button.example")
    assert samples.count() == len(EXAMPLES), page.locator("#owlet-examples").inner_html()[:2000]

    for index, (scene, turn) in enumerate(EXAMPLES.values()):
        page.locator("#owlet-new").click()
        page.wait_for_function("document.querySelectorAll('#owlet-chat .message-row').length == 0", timeout=30_000)
        samples.nth(index).click()
        page.wait_for_function(f"document.querySelector('#owlet-input textarea').value == {turn.question!r}",
                               timeout=30_000)
        page.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
        _seen, status = ask(page, turn.question)
        assert page.locator(f"{USER} img").count() == 1, "the example's picture went with the question"
        answer = page.locator(BOT).last.inner_text().strip()
        assert answer == turn.answer, f"example {index}: asked {turn.question!r}, got {answer!r} ({status})"
        if index == 0:
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "ui-browser-example.png"))
