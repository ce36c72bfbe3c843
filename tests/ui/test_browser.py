"""One real browser session (headless Chromium via Playwright) against the real stack: upload an image,
ask, watch the answer stream, ask a follow-up, reload and keep the same identity. Saves screenshots
under artifacts/."""
from __future__ import annotations

import os
import time

import pytest
import redis

from tests.ui.page_client import engine_running, metrics_text
from tests.ui.stack import ARTIFACTS, make_image
from ui.shared import wording

CHROMIUM = os.environ.get("OWLET_CHROMIUM", "/usr/bin/chromium")
LAUNCH_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
               "--disable-sync", "--no-first-run"]

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]

BOT = "#owlet-chat .message-row.bot-row"
USER = "#owlet-chat .message-row.user-row"
QUESTION = f"{USER}:not(:has(img))"  # a question's row: a picture sent with it is a row of its own


@pytest.fixture
def page():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        context = browser.new_context(viewport={"width": 1100, "height": 900})
        yield context.new_page()
        browser.close()


def ask(page, text: str) -> tuple[list[str], str]:
    """Type and send a question; return the distinct texts the answer bubble showed while streaming, and
    the final status line as shown (its figures closed)."""
    bots_before = page.locator(BOT).count()
    # with the figures, which differ between two answers even where "Answered in 0.5 s" does not
    status_before = page.locator("#owlet-status").text_content()
    page.locator("#owlet-input textarea").fill(text)
    page.locator("#owlet-input textarea").press("Enter")
    seen: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if page.locator(BOT).count() > bots_before:
            current = page.locator(BOT).last.inner_text().strip()
            if current and (not seen or seen[-1] != current):
                seen.append(current)
        status, whole = page.locator("#owlet-status").inner_text(), page.locator("#owlet-status").text_content()
        # Components re-render separately: wait for this answer's own line, not the previous one, and
        # for the input box to be open again (the last update of a turn).
        if "Answered in" in status and whole != status_before and page.locator(BOT).count() > bots_before \
                and not page.locator(BOT).last.inner_text().startswith(wording.WAITING_MARK) \
                and not page.locator("#owlet-input textarea").is_disabled():
            return seen, status
        assert wording.WARNING_MARK not in status, status
        time.sleep(0.02)
    raise AssertionError(f"no answer; status: {page.locator('#owlet-status').inner_text()!r}")


def browser_owners(stack) -> dict[str, int]:
    """Conversations per anonymous (browser) owner in this stack's Redis namespace."""
    r = redis.Redis.from_url(stack.redis_url)
    owners: dict[str, int] = {}
    for key in r.scan_iter(match=stack.prefix + "conv:*", count=1000):
        if key.endswith(b":turns") or r.type(key) != b"hash":
            continue
        user = (r.hget(key, "user") or b"").decode()
        if user.startswith("anon:"):
            owners[user] = owners.get(user, 0) + 1
    r.close()
    return owners


def test_upload_ask_stream_follow_up_and_reload(endless_stack, page, tmp_path):
    stack = endless_stack  # its answers run to their length, so the one stopped below is still running when asked
    owners_before = browser_owners(stack)  # other tests' browsers share this stack
    ARTIFACTS.mkdir(exist_ok=True)
    page.goto(stack.url)
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    page.locator("#owlet-input input[type=file]").set_input_files(str(make_image(tmp_path / "red.png")))
    page.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)

    seen, _status = ask(page, "What colour is the shape?")
    partials = [s for s in seen if not s.startswith(wording.WAITING_MARK)]
    assert len(partials) >= 2, f"the answer should stream in several steps, saw {seen!r}"
    assert page.locator(f"{USER} img").count() == 1, "the uploaded image is shown in the chat"
    page.wait_for_function(f"document.querySelector('{USER} img').naturalWidth > 0", timeout=10_000)
    page.screenshot(path=str(ARTIFACTS / "ui-browser-first-answer.png"))

    _seen, status = ask(page, "Where is it in the picture?")
    assert page.locator(QUESTION).count() == 2 and page.locator(BOT).count() == 2
    page.locator("#owlet-status details summary").click()  # the figures, on demand
    assert "session cache hit" in page.locator("#owlet-status").inner_text(), status
    page.screenshot(path=str(ARTIFACTS / "ui-browser-follow-up.png"))

    # A reload keeps the browser's identity and reopens the conversation, which then continues.
    page.reload()
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    page.wait_for_function(f"document.querySelectorAll('{QUESTION}').length == 2", timeout=30_000)
    page.wait_for_function("document.querySelector('#owlet-status').innerText.includes('restored')",
                           timeout=10_000)
    ask(page, "Hello after a reload?")
    assert page.locator(QUESTION).count() == 3
    new = {user: n - owners_before.get(user, 0) for user, n in browser_owners(stack).items()
           if n != owners_before.get(user, 0)}
    assert list(new.values()) == [1], "one browser id, one conversation"

    # Stop mid-answer from the browser: the stream ends at once and the engine slot is freed.
    page.locator("#owlet-settings").click()
    page.locator("#owlet-answer-length input[type=number]").fill("1500")
    page.locator("#owlet-answer-length input[type=number]").press("Enter")
    bots = page.locator(BOT).count()
    page.locator("#owlet-input textarea").fill("Tell me everything.")
    page.locator("#owlet-input textarea").press("Enter")
    page.wait_for_function(f"document.querySelectorAll('{BOT}').length > {bots} && !document.querySelectorAll("
                           f"'{BOT}')[{bots}].innerText.startsWith('{wording.WAITING_MARK}')",
                           timeout=60_000)
    page.locator("#owlet-input button.stop-button").click()
    page.wait_for_function("document.querySelector('#owlet-status').innerText.startsWith('Stopped')", timeout=30_000)
    deadline = time.monotonic() + 15
    while engine_running(metrics_text(stack)) > 0:
        assert time.monotonic() < deadline, "the stopped answer still holds an engine slot"
        time.sleep(0.2)
    page.screenshot(path=str(ARTIFACTS / "ui-browser-stopped.png"))

    # "New conversation" empties the chat, and a reload does not bring the old one back.
    page.locator("#owlet-new").click()
    page.wait_for_function("document.querySelectorAll('#owlet-chat .message-row').length == 0", timeout=30_000)
    time.sleep(0.5)
    page.reload()
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    time.sleep(1.0)
    assert page.locator(USER).count() == 0


def test_markup_in_a_message_is_shown_not_run(stack, page):
    """Chat text is rendered as sanitised markdown: HTML in a message (a user's, or a real VLM's answer read off
    a crafted picture) cannot run script in the browser, which holds the visitor's identity token."""
    page.goto(stack.url)
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    payload = ('<img src="x" onerror="window.__owletXss = 1"> <script>window.__owletXss = 2</script> '
               '<a href="javascript:window.__owletXss = 3" id="owlet-xss-link">link</a> **still markdown**')
    ask(page, payload)
    page.reload()  # the restored conversation is rendered from the stored history: it must be as safe
    page.wait_for_function(f"document.querySelectorAll('{USER}').length == 1", timeout=30_000)
    for link in page.locator("#owlet-xss-link").all():
        link.click()
    time.sleep(0.5)
    assert page.evaluate("window.__owletXss") is None, "markup in a message ran"
    assert page.locator("#owlet-chat img[src='x'][onerror]").count() == 0
    assert page.locator(f"{USER} strong").count() == 1, "ordinary markdown still renders"
