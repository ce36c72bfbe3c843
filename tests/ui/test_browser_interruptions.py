"""A real browser (headless Chromium) interrupting an answer that is still queued: "New conversation", a reload.
The page runs with no worker, so a question stays queued for as long as the test needs (tests.security.pages).
What they guard against: after "New conversation" the old chat came back 2-3 s later with its waiting
bubble and a locked box, until the page was reloaded."""
from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.security.pages import page_without_worker
from tests.ui.test_browser import BOT, CHROMIUM, LAUNCH_ARGS, USER
from ui.shared.wording import WAITING_MARK

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]


@pytest.fixture
def browser_and_page():
    from playwright.sync_api import sync_playwright

    with page_without_worker("ui-interrupt", queue_poll_s=0.3) as (url, owlet), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        tab = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
        tab.goto(url)
        tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
        try:
            yield tab, owlet
        finally:
            browser.close()


def send(tab, text: str) -> None:
    tab.locator("#owlet-input textarea").fill(text)
    tab.locator("#owlet-input textarea").press("Enter")


def wait_for(condition, timeout: float = 20, what: str = "", tab=None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    shown = ""
    if tab is not None:  # what the page showed instead
        bots = tab.locator(BOT)
        shown = (f"; status {tab.locator('#owlet-status').inner_text()!r}, "
                 f"last answer {bots.last.inner_text()[:200] if bots.count() else None!r}")
    raise AssertionError(f"timed out waiting for {what}{shown}")


@pytest.fixture
def chromium_context():
    """A browser context (tabs in it share the browser's identity and remembered conversation)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=LAUNCH_ARGS)
        try:
            yield browser.new_context(viewport={"width": 1100, "height": 900})
        finally:
            browser.close()


def open_tab(context, url: str):
    tab = context.new_page()
    tab.goto(url)
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    return tab


def answered(tab, bots: int) -> bool:
    """The tab shows ``bots`` answers, the last one finished (not the waiting bubble a sent question shows at once),
    and the box is open again."""
    return (tab.locator(BOT).count() == bots and not tab.locator("#owlet-input textarea").is_disabled()
            and "Answered in" in tab.locator("#owlet-status").inner_text()
            and not tab.locator(BOT).last.inner_text().startswith(WAITING_MARK))


def queued(tab, bots: int) -> bool:
    return tab.locator(BOT).count() == bots and "in line" in tab.locator(BOT).last.inner_text()


@contextlib.contextmanager
def paused(worker: int):
    """The stack's worker stopped for the block (as a busy worker would be), at most a few seconds."""
    os.kill(worker, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(worker, signal.SIGCONT)


@contextlib.contextmanager
def follow_up_held(context, stack, question: str = "how many shapes?"):
    """A tab whose first answer is in and whose follow-up ``question`` is queued behind the stack's worker, which
    stays paused for the block (as a busy worker would be)."""
    tab = open_tab(context, stack.url)
    send(tab, "first question")  # the browser remembers a conversation once its first answer is in
    wait_for(lambda: answered(tab, 1), timeout=60, what="the first answer", tab=tab)
    with paused(stack.children["worker"].pid):
        send(tab, question)
        wait_for(lambda: queued(tab, 2), what="the follow-up to be queued")
        yield tab


def test_new_conversation_while_queued_stays_new(browser_and_page):
    tab, owlet = browser_and_page
    send(tab, "how many shapes?")
    wait_for(lambda: "in line" in tab.locator(BOT).last.inner_text() if tab.locator(BOT).count() else False,
             what="the queued bubble")
    tab.locator("#owlet-new").click()
    wait_for(lambda: tab.locator(BOT).count() == 0, what="the chat to clear")
    time.sleep(4)  # several queue polls: the abandoned stream must not bring the old chat back
    assert tab.locator(BOT).count() == 0 and tab.locator(USER).count() == 0, tab.locator("#owlet-chat").inner_text()
    assert not tab.locator("#owlet-input textarea").is_disabled(), "the box is open for the next question"
    assert owlet.queue_stats()["queued"] == 0, "the abandoned question was cancelled"
    send(tab, "a new question")
    wait_for(lambda: tab.locator(USER).count() == 1 and "in line" in tab.locator(BOT).last.inner_text(),
             what="the new question to be queued")


def test_new_conversation_stays_new_when_the_old_answer_ends_later(stack, chromium_context):
    """The old answer's stream ends only after the fresh chat is shown (its worker is paused for a moment, as a
    busy worker would be): Gradio then re-applied the stream's last update, bringing back the old chat with its
    waiting bubble and a locked box."""
    with follow_up_held(chromium_context, stack) as tab:
        tab.locator("#owlet-new").click()
        wait_for(lambda: tab.locator(BOT).count() == 0, what="the chat to clear")
        time.sleep(0.8)
    time.sleep(3)  # the cancelled job's end reaches the old stream now
    assert tab.locator(BOT).count() == 0 and tab.locator(USER).count() == 0, tab.locator("#owlet-chat").inner_text()
    assert not tab.locator("#owlet-input textarea").is_disabled(), "the box is open for the next question"


def test_a_reload_during_an_answer_goes_on_streaming_it(stack, chromium_context):
    """A question asked, then the page reloaded while it was queued: the restored chat showed the question with no
    answer, no Stop and no sign of progress, and the answer appeared only after another reload."""
    with follow_up_held(chromium_context, stack) as tab:
        tab.reload()
        tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
        wait_for(lambda: tab.locator(USER).count() == 2 and queued(tab, 2), what="the restored chat to show progress")
        assert tab.locator("#owlet-input textarea").is_disabled(), "answering: the box offers Stop"
    wait_for(lambda: answered(tab, 2), what="the answer, without a reload")
    assert "in line" not in tab.locator(BOT).last.inner_text()


def test_a_reload_during_the_first_answer_reopens_the_new_chat(browser_and_page):
    """The browser learns a new conversation's id only when its first answer ends: a reload before then opened an
    empty chat, and the question asked went on being answered out of sight. "New conversation" still means new."""
    tab, owlet = browser_and_page
    send(tab, "how many shapes?")
    wait_for(lambda: queued(tab, 1), what="the first question to be queued")
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    wait_for(lambda: tab.locator(USER).count() == 1 and queued(tab, 1), what="the new chat, reopened, still queued")
    assert "how many shapes?" in tab.locator(USER).first.inner_text()
    assert tab.locator("#owlet-input textarea").is_disabled(), "answering: the box offers Stop"
    tab.reload()  # remembered by the browser now, so it reopens from there too
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    wait_for(lambda: tab.locator(USER).count() == 1 and queued(tab, 1), what="the chat after a second reload")
    assert owlet.queue_stats()["queued"] == 1, "one question, followed by each page in turn, never asked twice"

    tab.locator("#owlet-new").click()
    wait_for(lambda: tab.locator(BOT).count() == 0, what="the chat to clear")
    wait_for(lambda: owlet.queue_stats()["queued"] == 0, what="the abandoned question to be cancelled")
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    time.sleep(2)  # on_load has answered by now
    assert tab.locator(BOT).count() == 0 and tab.locator(USER).count() == 0, tab.locator("#owlet-chat").inner_text()


def test_a_reload_before_the_browser_remembered_its_chat_reopens_it(browser_and_page):
    """The browser remembers a chat in an event of its own, after the answer's last update: a reload before that
    event's reply came back (a busy page) opened an empty chat, with the conversation out of the page's reach. Here
    the browser's remembered chat is dropped after the answer ends, which is what such a reload finds."""
    from ui.app import CONVERSATION_KEY

    tab, owlet = browser_and_page
    send(tab, "how many shapes?")
    wait_for(lambda: queued(tab, 1), what="the question to be queued")
    tab.locator("#owlet-input button.stop-button").click()
    wait_for(lambda: "stopped" in tab.locator(BOT).last.inner_text(), what="the stopped answer's end", tab=tab)
    time.sleep(1)  # the browser's own remembering has come and gone: take it back
    tab.evaluate(f"localStorage.removeItem({CONVERSATION_KEY!r})")
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    wait_for(lambda: tab.locator(USER).count() == 1, what="the chat, reopened", tab=tab)
    assert "how many shapes?" in tab.locator(USER).first.inner_text()
    wait_for(lambda: tab.evaluate(f"localStorage.getItem({CONVERSATION_KEY!r})") is not None,
             what="the browser to remember it again")
    assert owlet.queue_stats()["queued"] == 0, "nothing asked again"


def test_a_reload_before_the_browser_remembered_leaving_a_chat_keeps_it_closed(browser_and_page):
    """The browser remembers leaving a chat with "New conversation" in an event of its own, after the chat was
    cleared: a reload before that event's reply came back reopened the chat left. Here the browser's kept chat is
    put back as it was before the leaving, which is what such a reload finds."""
    from ui.app import CONVERSATION_KEY

    tab, _owlet = browser_and_page
    send(tab, "how many shapes?")
    wait_for(lambda: queued(tab, 1), what="the question to be queued")
    tab.locator("#owlet-input button.stop-button").click()
    wait_for(lambda: "stopped" in tab.locator(BOT).last.inner_text(), what="the stopped answer's end", tab=tab)
    time.sleep(1)  # the browser has remembered the chat
    kept = tab.evaluate(f"localStorage.getItem({CONVERSATION_KEY!r})")
    assert kept is not None
    tab.locator("#owlet-new").click()
    wait_for(lambda: tab.locator(USER).count() == 0, what="the chat to clear", tab=tab)
    time.sleep(1)  # the browser's own remembering of the leaving has come and gone: take it back
    tab.evaluate(f"localStorage.setItem({CONVERSATION_KEY!r}, {kept!r})")
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    wait_for(lambda: tab.evaluate(f"localStorage.getItem({CONVERSATION_KEY!r})") != kept,
             what="the page to tell the browser to forget the chat left", tab=tab)
    assert tab.locator(USER).count() == 0 and tab.locator(BOT).count() == 0, tab.locator("#owlet-chat").inner_text()


def test_a_reopened_conversation_shows_its_pictures_to_its_owner_only(stack, chromium_context, tmp_path):
    """A reload showed every picture of the reopened chat as a "🖼️ (image)" placeholder. Now the stored bytes are
    written back as an upload of the caller's address, which no other address is served."""
    import httpx

    from tests.ui.stack import make_image

    tab = open_tab(chromium_context, stack.url)
    tab.locator("#owlet-input input[type=file]").set_input_files(str(make_image(tmp_path / "red.png")))
    wait_for(lambda: tab.locator("#owlet-input img").count() > 0, what="the thumbnail")
    send(tab, "what colour is it?")
    wait_for(lambda: answered(tab, 1), what="the answer")
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    picture = tab.locator(f"{USER} img")
    # 60 s, as for the page itself above: once, under a full suite, the picture had not loaded in 20 s
    wait_for(lambda: picture.count() == 1 and picture.evaluate("img => img.complete && img.naturalWidth > 0"),
             timeout=60, what="the reopened picture to load", tab=tab)
    assert "(image)" not in tab.locator("#owlet-chat").inner_text(), "no placeholder"
    src = picture.get_attribute("src")
    url = src if src.startswith("http") else stack.url.rstrip("/") + src
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"), timeout=30) as stranger:
        assert stranger.get(url).status_code == 403, "another address is not shown the written-back picture"
    with httpx.Client(timeout=30) as owner:
        assert owner.get(url).status_code == 200


def test_two_tabs_of_one_chat_both_get_the_answer(stack, chromium_context):
    """A second tab (same browser, so the same identity and conversation) reopened the chat and took the answer
    from the first, which stayed waiting with a locked box for two minutes, then said the worker was lost."""
    with follow_up_held(chromium_context, stack) as first:
        second = open_tab(chromium_context, stack.url)
        wait_for(lambda: queued(second, 2), what="the second tab to show the pending answer")
    for tab in (first, second):
        wait_for(lambda: answered(tab, 2), timeout=30, what="the answer in both tabs")
    assert first.locator(BOT).last.inner_text() == second.locator(BOT).last.inner_text()


def test_a_question_typed_after_stop_is_kept_and_sent(stack, chromium_context):
    """After Stop, while the stopped answer's event had not ended (its worker busy), a question typed into the box
    was wiped by that event's last updates, and Enter sent nothing."""
    with follow_up_held(chromium_context, stack, "a slow one") as tab:
        tab.locator("#owlet-input .stop-button").click()
        wait_for(lambda: not tab.locator("#owlet-input textarea").is_disabled(), what="Stop to open the box")
        tab.locator("#owlet-input textarea").fill("my next question")
        time.sleep(0.8)
    wait_for(lambda: "stopped" in tab.locator(BOT).last.inner_text(), what="the stopped answer's end")
    time.sleep(1)
    assert tab.locator("#owlet-input textarea").input_value() == "my next question", "the draft is kept"
    tab.locator("#owlet-input textarea").press("Enter")
    wait_for(lambda: answered(tab, 3) and "my next question" in tab.locator(USER).last.inner_text(),
             what="the question sent and answered")


def test_a_reopened_conversation_that_gave_way_says_so(browser_and_page):
    """The service-wide history budget cleared a visitor's conversation (the least recently used, whole: a full Redis
    runs MAKE_ROOM). Reloaded, the page showed an empty chat and no reason; now it says why, once: the browser
    forgets the conversation, so the next reload is a plain new chat."""
    from worker.errors import ConversationCleared

    tab, owlet = browser_and_page
    send(tab, "how many shapes?")
    wait_for(lambda: queued(tab, 1), what="the question to be queued")
    tab.locator("#owlet-input button.stop-button").click()
    wait_for(lambda: tab.locator("#owlet-status").inner_text().startswith("Stopped"), what="the stopped answer")
    time.sleep(1)  # the browser remembers the conversation once the answer's stream has ended
    assert owlet.jobs.make_room() > 0, "the idle conversation gave way"
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    wait_for(lambda: ConversationCleared.user_message in tab.locator("#owlet-status").inner_text(),
             what="the page to say the conversation was cleared")
    assert tab.locator(USER).count() == 0 and tab.locator(BOT).count() == 0
    tab.reload()
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    time.sleep(2)  # on_load has answered by now
    assert ConversationCleared.user_message not in tab.locator("#owlet-status").inner_text(), "said once"
    send(tab, "a new question")
    wait_for(lambda: tab.locator(USER).count() == 1 and queued(tab, 1), what="a new conversation's question")
