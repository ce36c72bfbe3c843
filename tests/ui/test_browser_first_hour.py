"""A visitor's first questions, in headless Chromium at a laptop's size (1280x800) and a phone's (390x844), doing what
a newcomer did: ask about a picture while the workers are busy, edit that first question, send a file that is not a
picture, one with too many pixels and one of 11 MB, then ask on.

What they guard against: editing the first question (the one carrying the picture) sent nothing; an 11 MB picture
was dropped by Gradio with a toast and the question answered without it; Gradio's "queue: 1/1 | 0.2/0.3s" and
"processing | 0.5s" showed in the chat and the status line; under load the sent question took up to 1.4 s to show;
a picture's Share button only logged an error and the chat's trash did what "New conversation" does; refusals
vanished on the next turn; the phone's example cards had uneven widths under a large empty chat; autoscroll cut off
the top of a picture's turn; the box was announced as "MultimodalTextbox"; the sign-in page was Gradio's, with
"Incorrect Credentials".
"""
from __future__ import annotations

import os
import time

import pytest

from tests.security.pages import page_without_worker
from tests.ui.page_geometry import SIZES, within_first_view
from tests.ui.stack import ARTIFACTS, make_image
from tests.ui.test_browser import BOT, CHROMIUM, USER
from tests.ui.test_browser_interruptions import paused, wait_for
from ui.page_script import SENDING
from ui.shared.wording import WAITING_MARK
from ui.sign_in import WRONG_PAIR
from ui.uploads.image_check import too_large_message

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]

EXAMPLE_CARD = "#owlet-examples .gallery-item"
# Gradio's own counters, as a visitor would read them anywhere on the page.
WATCH_COUNTERS = r"""
window.__gradioCounters = [];
const counters = /queue:\s*\d+\s*\/\s*\d+|processing\s*\|/;
let looking = false;
new MutationObserver(() => {
  if (looking || !document.body) return;
  looking = true;
  requestAnimationFrame(() => {
    looking = false;
    const seen = document.body.innerText.match(counters);
    if (seen) window.__gradioCounters.push(seen[0]);
  });
}).observe(document, {childList: true, subtree: true, characterData: true});
"""
# When Enter was pressed in the box, and when the chat first showed the text in window.__sentText.
WATCH_SENT = r"""
window.__sentAt = null; window.__shownAt = null; window.__sentText = null;
document.addEventListener("keydown", (e) => {
  if (e.key === "Enter" && e.target.closest("#owlet-input")) window.__sentAt = performance.now();
}, true);
new MutationObserver(() => {
  const chat = document.querySelector("#owlet-chat");
  if (window.__sentText && window.__shownAt === null && chat && chat.innerText.includes(window.__sentText))
    window.__shownAt = performance.now();
}).observe(document, {childList: true, subtree: true, characterData: true});
"""


@pytest.fixture(params=sorted(SIZES))
def tab(request, chromium, stack):
    context = chromium.new_context(viewport=SIZES[request.param])
    context.add_init_script(WATCH_COUNTERS)
    context.add_init_script(WATCH_SENT)
    page = context.new_page()
    page.goto(stack.url)
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    page.size_name = request.param
    try:
        yield page
    finally:
        context.close()


def status(tab) -> str:
    return tab.locator("#owlet-status").inner_text()


def attach(tab, path) -> None:
    """Attach a file the way a visitor does, once the box is open, and wait for its thumbnail; if none shows, say
    what the upload requests got and what the page showed (Gradio reports a refused upload in a toast)."""
    wait_for(lambda: not tab.locator("#owlet-input textarea").is_disabled(), what="the box open to a new file", tab=tab)
    uploads = []

    def upload_name(url):  # the endpoint's last path part ("upload"), or None for any other request
        return url.split("?")[0].rsplit("/", 1)[-1] if "/gradio_api/upload" in url else None

    def answered(response):
        if upload_name(response.url):
            uploads.append(f"{response.status} {upload_name(response.url)}")

    def failed(request):
        if upload_name(request.url):
            uploads.append(f"failed ({request.failure}) {upload_name(request.url)}")
    tab.on("response", answered)
    tab.on("requestfailed", failed)
    try:
        tab.locator("#owlet-input input[type=file]").set_input_files(str(path))
        # 60 s, as for a reopened picture: once, in a full suite on two busy cores, the upload of a small file had
        # not come back in 20 s (alone it takes well under one)
        wait_for(lambda: tab.locator("#owlet-input img, #owlet-input .thumbnail-item").count() > 0, timeout=60,
                 what="the picture's thumbnail in the box", tab=tab)
    except AssertionError as exc:
        toasts = [text.strip() for text in tab.locator(".toast-body").all_inner_texts()]
        raise AssertionError(f"{exc}; {path.name}: upload requests {uploads or 'none'}, toasts {toasts}") from None
    finally:
        tab.remove_listener("response", answered)
        tab.remove_listener("requestfailed", failed)


def send(tab, text: str) -> None:
    tab.locator("#owlet-input textarea").fill(text)
    tab.locator("#owlet-input textarea").press("Enter")


def answered_after(tab, before: str, what: str, timeout: float = 60) -> None:
    """Wait for an answer whose status line is not ``before`` (the figures differ between two answers), in place of
    the waiting bubble a sent question shows at once."""
    def done():
        now = tab.locator("#owlet-status").text_content()
        return ("Answered in" in now and now != before
                and not tab.locator(BOT).last.inner_text().startswith(WAITING_MARK)
                and not tab.locator("#owlet-input textarea").is_disabled())
    wait_for(done, timeout=timeout, what=what, tab=tab)


def visible(tab, selector: str) -> int:
    return sum(1 for e in tab.locator(selector).all() if e.is_visible())


def latest_turn_top_on_view(tab) -> bool:
    """Whether the top of the latest question (its picture) is inside the chat's scrolling box."""
    return tab.evaluate("""() => {
        const box = document.querySelector('#owlet-chat .bubble-wrap').getBoundingClientRect();
        const rows = [...document.querySelectorAll('#owlet-chat .message-row')];
        let i = rows.length - 1;
        while (i >= 0 && !rows[i].classList.contains('user-row')) i--;
        while (i > 0 && rows[i - 1].classList.contains('user-row')) i--;
        const top = rows[i].getBoundingClientRect().top;
        return top >= box.top - 1 && top < box.bottom;
    }""")


def test_a_visitor_asks_edits_is_refused_and_asks_on(tab, stack, tmp_path):
    first, edited = "what colour is the shape?", "how many shapes are there?"
    attach(tab, make_image(tmp_path / "red.png"))
    # The workers are busy and the page slow to answer: the question shows at once all the same.
    tab.evaluate("(text) => { window.__sentText = text; }", first)
    tab.route("**/gradio_api/queue/join*", lambda route: (time.sleep(1.0), route.continue_()))
    with paused(stack.children["worker"].pid):
        before = tab.locator("#owlet-status").text_content()
        send(tab, first)
        wait_for(lambda: tab.evaluate("window.__shownAt") is not None, what="the sent question in the chat")
        shown_ms = tab.evaluate("window.__shownAt - window.__sentAt")
        assert shown_ms < 200, f"the question showed {shown_ms:.0f} ms after Enter"
        assert SENDING in tab.locator(BOT).last.inner_text(), "with Owlet's waiting line under it"
        wait_for(lambda: "in line" in status(tab), what="the queue line", tab=tab)
    tab.unroute("**/gradio_api/queue/join*")
    answered_after(tab, before, "the first answer")
    wait_for(lambda: tab.locator(f"{USER} img").count() == 1, what="the picture with the question")
    assert latest_turn_top_on_view(tab), f"{tab.size_name}: the top of the picture's turn is cut off"
    assert visible(tab, "#owlet-chat button:has(path[d^='M23,20a5'])") == 0, "no Share button on the picture"
    trash = "#owlet-chat > .wrapper > .top-panel button"  # the chat's own buttons above its messages
    assert tab.locator(trash).count() > 0 and visible(tab, trash) == 0, "no trash ('New conversation' does that)"

    # Edit the first question, the one that carries the picture: it is asked again.
    tab.locator(USER).filter(has_text=first).hover()
    tab.locator("#owlet-chat button[aria-label='Edit']").first.click()  # the first question's: only questions have one
    tab.locator("#owlet-chat textarea.edit-textarea").fill(edited)
    before = tab.locator("#owlet-status").text_content()
    tab.locator("#owlet-chat button[aria-label='Submit']").click()
    wait_for(lambda: edited in tab.locator("#owlet-chat").inner_text(), what="the edited question", tab=tab)
    answered_after(tab, before, "the edited question's answer")
    assert edited in tab.locator(USER).last.inner_text() and first not in tab.locator("#owlet-chat").inner_text()
    wait_for(lambda: tab.locator(f"{USER} img").count() == 1, what="the picture, redrawn")
    assert tab.locator(BOT).count() == 1, "still one turn"

    # A file that is not a picture, a picture of too many pixels and one of 11 MB: each refused in the chat.
    not_a_picture = tmp_path / "notes.png"
    not_a_picture.write_text("these are my notes, not a picture\n" * 10)
    eleven_mb = eleven_megabyte_picture(tmp_path / "holiday.png")
    refusals = [(not_a_picture, "This file is not an image we can read"),
                (make_image(tmp_path / "huge.png", size=(5000, 5000)), "5000×5000 pixels"),
                (eleven_mb, too_large_message(eleven_mb.stat().st_size, 10 * 1024 * 1024))]
    for picture, sentence in refusals:
        bots = tab.locator(BOT).count()
        attach(tab, picture)
        send(tab, f"and {picture.name}?")
        wait_for(lambda: sentence in tab.locator(BOT).last.inner_text(), what=f"the refusal of {picture.name}",
                 tab=tab)
        assert sentence in status(tab) and tab.locator(BOT).count() == bots + 1
    time.sleep(1.0)
    assert "Answered" not in status(tab) and not tab.locator("#owlet-input textarea").is_disabled(), \
        "no answer to the question sent with the 11 MB picture"
    assert "maximum allowed size" not in tab.locator("body").inner_text(), "no Gradio toast"

    before = tab.locator("#owlet-status").text_content()
    send(tab, "and the first picture again?")
    answered_after(tab, before, "the follow-up's answer")
    chat = tab.locator("#owlet-chat").inner_text()
    for _picture, sentence in refusals:
        assert sentence in chat, f"the refusal {sentence!r} stayed in the chat"
    wait_for(lambda: tab.locator(f"{USER} img").count() == 1, what="the first picture, still the conversation's")
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"ui-first-hour-{tab.size_name}.png"))
    assert tab.evaluate("window.__gradioCounters") == [], "Gradio's own counters were shown"

    tab.reload()  # the stored conversation is the edited one
    tab.wait_for_selector("#owlet-input textarea", timeout=60_000)
    wait_for(lambda: tab.locator(BOT).count() == 2, what="the restored conversation", tab=tab)
    assert edited in tab.locator(USER).nth(1).inner_text() and first not in tab.locator("#owlet-chat").inner_text()


def eleven_megabyte_picture(path):
    """A real 11 MB picture: 1,920 x 1,920 pixels of noise, stored without compression."""
    import numpy as np
    from PIL import Image

    noise = np.random.default_rng(55).integers(0, 256, size=(1920, 1920, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path, compress_level=0)
    assert 10.5 * 2**20 < path.stat().st_size < 11.5 * 2**20, path.stat().st_size
    return path


def test_the_first_view_names_the_box_and_shows_the_examples_evenly(tab):
    assert "MultimodalTextbox" not in tab.locator("#owlet-input").aria_snapshot()
    assert "Your question" in tab.locator("#owlet-input").aria_snapshot(), "the box's accessible name"
    cards = [card.bounding_box() for card in tab.locator(EXAMPLE_CARD).all()]
    assert len(cards) >= 3 and all(within_first_view(tab, f"{EXAMPLE_CARD} >> nth={i}") for i in range(len(cards)))
    if tab.size_name == "phone":
        widths = [card["width"] for card in cards]
        assert max(widths) - min(widths) <= 1, f"uneven example cards: {widths}"
        assert tab.locator("#owlet-chat").bounding_box()["height"] < 120, "no large empty chat above the examples"
    assert tab.evaluate("window.__gradioCounters") == []


def test_the_sign_in_page_is_owlets(chromium):
    with page_without_worker("ui-sign-in", auth=(("alice", "wonderland"),)) as (url, _owlet):
        for size in sorted(SIZES):
            context = chromium.new_context(viewport=SIZES[size])
            page = context.new_page()
            page.goto(url)
            assert "Owlet" in page.locator("h1").inner_text() and within_first_view(page, "form button")
            page.fill("#owlet-name", "alice")
            page.fill("#owlet-password", "not her password")
            page.click("form button")
            wait_for(lambda: page.locator("#owlet-sign-in-said").inner_text() == WRONG_PAIR, what="the refusal")
            assert "Incorrect Credentials" not in page.locator("body").inner_text()
            page.fill("#owlet-password", "wonderland")
            page.click("form button")
            page.wait_for_selector("#owlet-input textarea", timeout=60_000)
            context.close()
