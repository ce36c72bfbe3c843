"""A real browser (headless Chromium) meeting the page's refusals and its picture rules. What they guard
against: a refused question lost its text and picture, the refusal was drawn below the examples (off a phone's
screen), a second picture was mixed with the first in one conversation, and a question without any picture got
the model's "I only know about shapes" with no hint to attach one."""
from __future__ import annotations

import pytest

from tests.security.pages import page_without_worker
from tests.ui.stack import make_image
from tests.ui.test_browser import BOT, CHROMIUM, QUESTION
from tests.ui.test_browser_interruptions import send, wait_for
from ui.shared import wording

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not __import__("os").path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]

PHONE = {"width": 390, "height": 844}


def open_tab(browser, url: str, viewport=None):
    tab = browser.new_context(viewport=viewport or {"width": 1100, "height": 900}).new_page()
    tab.goto(url)
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    return tab


def attach(tab, path) -> None:
    tab.locator("#owlet-input input[type=file]").set_input_files(str(path))
    wait_for(lambda: tab.locator("#owlet-input img").count() > 0, what="the picture's thumbnail")


def on_screen(tab, selector: str) -> bool:
    box = tab.locator(selector).bounding_box()
    return box is not None and 0 <= box["y"] and box["y"] + box["height"] <= tab.viewport_size["height"]


def test_a_refused_question_keeps_its_text_and_picture_and_says_why_on_screen(chromium, tmp_path):
    with page_without_worker("ui-refusals", address_max_events=1) as (url, owlet):
        tab = open_tab(chromium, url, PHONE)
        assert on_screen(tab, "#owlet-input"), "a phone shows the whole box on first load (it showed 50 px of it)"
        attach(tab, make_image(tmp_path / "red.png"))
        tab.locator("#owlet-input textarea").fill("x" * 4100)  # too long: the page's own check
        tab.locator("#owlet-input textarea").press("Enter")
        wait_for(lambda: "longer than" in tab.locator("#owlet-status").inner_text(), what="the length refusal")
        assert len(tab.locator("#owlet-input textarea").input_value()) == 4100, "text kept"
        assert tab.locator("#owlet-input img").count() > 0, "picture kept"
        assert on_screen(tab, "#owlet-status"), "the refusal is on a phone's screen, by the box"
        # half of an emoji's UTF-16 pair, as a broken paste leaves it: no UTF-8 form, so nothing can send it back
        # (the page stuck on "Sending your question" when its reply echoed it); refused like the over-long text
        tab.evaluate("""() => { const box = document.querySelector('#owlet-input textarea');
            const setValue = Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, 'value').set;
            setValue.call(box, 'what is it? \\ud83d');
            box.dispatchEvent(new Event('input', {bubbles: true})); }""")
        tab.locator("#owlet-input textarea").press("Enter")
        wait_for(lambda: "not text (an unpaired surrogate, U+D83D" in tab.locator("#owlet-status").inner_text(),
                 what="the unpaired surrogate's refusal", tab=tab)
        assert tab.locator("#owlet-input textarea").input_value() == "what is it? \ud83d", "text kept"
        assert tab.locator("#owlet-input img").count() > 0, "picture kept"
        assert tab.locator(BOT).count() == 0, "no waiting bubble was left for it"
        holder = open_tab(chromium, url)
        send(holder, "this question holds the address's only answer slot")
        wait_for(lambda: holder.locator(BOT).count() == 1 and "in line" in holder.locator(BOT).last.inner_text(),
                 what="the first question to be queued")
        send(tab, "what colour is the circle?")
        wait_for(lambda: "Too many answers" in tab.locator("#owlet-status").inner_text(), what="the slot refusal")
        assert tab.locator("#owlet-input textarea").input_value() == "what colour is the circle?", "text kept"
        assert tab.locator("#owlet-input img").count() > 0, "picture kept"
        assert not tab.locator("#owlet-input textarea").is_disabled()
        assert on_screen(tab, "#owlet-status")
        assert owlet.queue_stats()["queued"] == 1, "only the holder's question was admitted"


def status_line(tab) -> str:
    """The status line's own text (without Gradio's progress overlay), its closed figures included: they tell two
    answers apart where "Answered in 0.5 s" does not."""
    return tab.locator("#owlet-status [data-testid='markdown']").text_content().strip()


def ask_and_wait(tab, text: str, what: str) -> str:
    """Send ``text`` and wait for this answer's own final status (not the one before); returns it. The page shows a
    sent question at once, with a waiting bubble under it, before the answer replaces the bubble."""
    def answered():
        return (text in tab.locator(QUESTION).last.inner_text() and "Answered in" in status_line(tab)
                and not tab.locator(BOT).last.inner_text().startswith(wording.WAITING_MARK)
                and not tab.locator("#owlet-input textarea").is_disabled())
    send(tab, text)
    wait_for(answered, what=what, tab=tab)
    return status_line(tab)


def test_a_new_picture_starts_a_new_conversation_and_no_picture_gets_a_hint(stack, chromium, tmp_path):
    tab = open_tab(chromium, stack.url)
    assert ask_and_wait(tab, "what colour is the circle?", "the answer").startswith("No picture in this conversation")
    attach(tab, make_image(tmp_path / "red.png"))
    status = ask_and_wait(tab, "and now?", "the first picture's answer")
    assert "No picture" not in status and tab.locator(QUESTION).count() == 1, "the picture started a new conversation"
    assert "No picture" not in ask_and_wait(tab, "a follow-up about it", "the follow-up")
    assert tab.locator(QUESTION).count() == 2 and tab.locator(BOT).count() == 2
    damaged = tmp_path / "damaged.png"
    damaged.write_bytes(make_image(tmp_path / "whole.png").read_bytes()[:-60])
    attach(tab, damaged)
    send(tab, "and this one?")
    wait_for(lambda: "damaged" in status_line(tab), what="the damaged picture's refusal")
    assert tab.locator(QUESTION).count() == 3, "a refused picture leaves the conversation as it was (and says why)"
    assert "Answered in" in ask_and_wait(tab, "still the first picture?", "an answer in the same conversation")
    assert tab.locator(QUESTION).count() == 4 and tab.locator(BOT).count() == 4, "the refusal stays in the chat"
    assert "damaged" in tab.locator(BOT).nth(2).inner_text()
    attach(tab, make_image(tmp_path / "blue.png", colour=(20, 40, 220)))
    ask_and_wait(tab, "what about this one?", "the new picture's answer")
    assert tab.locator(QUESTION).count() == 1 and tab.locator(BOT).count() == 1, "a new conversation"
    assert "what about this one?" in tab.locator(QUESTION).last.inner_text()


def test_an_upload_refused_by_the_address_budget_says_why_in_the_browser(chromium, tmp_path):
    """An upload a per-address limit refuses is told as the page's sentence (Gradio's toast shows the 429's body),
    as gradio_client is told it (tests/security/test_fronts.py)."""
    import random

    from PIL import Image

    def picture(name: str):
        path = tmp_path / name  # 600 KB of random pixels: two do not fit a 1 MB budget
        Image.frombytes("RGB", (450, 450), random.randbytes(450 * 450 * 3)).save(path)
        return path

    with page_without_worker("ui-upload-refusal", max_upload_bytes=1024 * 1024,
                             address_upload_bytes=1024 * 1024) as (url, _owlet):
        attach(open_tab(chromium, url), picture("first.png"))
        tab = open_tab(chromium, url)
        tab.locator("#owlet-input input[type=file]").set_input_files(str(picture("second.png")))
        wait_for(lambda: "Upload limit reached" in tab.locator("body").inner_text(), what="the upload's refusal")
        assert "Try again in" in tab.locator("body").inner_text()
