"""A visitor's first minute, in headless Chromium at a laptop's size (1280x800) and a phone's (390x844): what the first
view shows, that the chat's controls never sit on each other, that no icon needs an emoji font (this Chromium has
none, as many Linux desktops), and that the status line speaks to visitors, with the figures one click away.

What they guard against: at 1280x800 the first view was mostly an empty chat, with the examples below the fold and
the box cut at the bottom edge; on a phone the chat's trash button covered the top message's copy and edit buttons;
the title's owl, the paperclip and "New conversation"'s emoji were empty boxes; the status line read "First token
0.04 s · 120.0 tokens/s · 2 tokens · session cache hit (105/121 prompt tokens reused)".
"""
from __future__ import annotations

import os
import re

import pytest

from tests.ui.page_geometry import BUTTON_GROUPS, SIZES, line_count, needs_emoji_font, overlaps, page_text, \
    visible_controls, within_first_view
from tests.ui.stack import ARTIFACTS, make_image
from tests.ui.test_browser import BOT, CHROMIUM, QUESTION, USER, ask

pytestmark = [pytest.mark.timeout(240),
              pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"no Chromium at {CHROMIUM}")]

EXAMPLE = "#owlet-examples .gallery-item, #owlet-examples tr.tr-body, #owlet-examples button.example"


@pytest.fixture(params=sorted(SIZES))
def tab(request, chromium, stack):
    context = chromium.new_context(viewport=SIZES[request.param])
    page = context.new_page()
    page.goto(stack.url)
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    page.wait_for_selector(EXAMPLE, timeout=30_000)
    page.size_name = request.param
    try:
        yield page
    finally:
        context.close()


def test_the_first_view_shows_the_box_an_example_and_two_lines_of_how_to_start(tab):
    assert tab.evaluate("window.scrollY") == 0
    assert within_first_view(tab, "#owlet-input textarea"), "the input box is on screen, whole"
    assert within_first_view(tab, "#owlet-input"), "the box with its attach and send buttons is on screen, whole"
    assert within_first_view(tab, EXAMPLE), "at least one example is on screen without scrolling"
    assert within_first_view(tab, "#owlet-how")
    lines = line_count(tab, "#owlet-how")
    assert lines <= 2.2, f"the instructions take {lines:.1f} lines"
    assert "attach" in tab.locator("#owlet-how").inner_text().lower()
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"ui-first-view-{tab.size_name}.png"))


def test_icons_are_the_pages_own_and_need_no_emoji_font(tab):
    missing = needs_emoji_font(page_text(tab))
    assert not missing, f"drawn only by an emoji font (empty boxes without one): {missing}"
    for icon in ("#owlet-title .owlet-owl", "#owlet-how .owlet-clip", "#owlet-new"):
        assert tab.locator(icon).count() == 1, icon
    # the icons are drawn: an owl in the title, a paperclip in the instructions, a mark on "New conversation"
    for selector, pseudo in (("#owlet-title .owlet-owl", None), ("#owlet-how .owlet-clip", None),
                             ("#owlet-new", "::before")):
        drawn = tab.evaluate("""([selector, pseudo]) => {
            const style = getComputedStyle(document.querySelector(selector), pseudo);
            const image = style.maskImage || style.webkitMaskImage || '';
            return [style.backgroundImage, image, style.width, style.height];
        }""", [selector, pseudo])
        assert "svg" in drawn[0] + drawn[1] and drawn[2] not in ("0px", "auto"), (selector, drawn)


def test_the_chats_controls_never_overlap(tab, tmp_path):
    tab.locator("#owlet-input input[type=file]").set_input_files(str(make_image(tmp_path / "red.png")))
    tab.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
    ask(tab, "What colour is the shape?")
    ask(tab, "And where is it?")
    assert tab.locator(QUESTION).count() == 2 and tab.locator(BOT).count() == 2
    tab.locator("#owlet-chat").scroll_into_view_if_needed()
    # Scroll the messages from top to bottom, hovering each message on view (some buttons show on hover), and check
    # the chat's controls at every step: no two of them meet, and nothing lies over one.
    scroller = "#owlet-chat .bubble-wrap"
    travel = tab.evaluate(f"(e => e.scrollHeight - e.clientHeight)(document.querySelector('{scroller}'))")
    seen = set()
    for top in [*range(0, int(travel), 15), travel]:
        tab.evaluate(f"document.querySelector('{scroller}').scrollTop = {top}")
        for x, y in on_view_message_centres(tab, scroller):
            tab.mouse.move(x, y)  # (a locator's hover would scroll the message into view)
            controls = visible_controls(tab, "#owlet-chat")
            seen.update((c["name"], round(c["y"] + tab.evaluate(f"document.querySelector('{scroller}').scrollTop")))
                        for c in controls)
            where = f"{tab.size_name}, messages scrolled {top} px, pointer at ({x:.0f}, {y:.0f})"
            assert not overlaps(controls), f"{where}: {overlaps(controls)}"
            covered = [c["name"] for c in controls if c["covered"]]
            assert not covered, f"{where}: covered by something else: {covered}"
            groups = visible_controls(tab, "#owlet-chat", BUTTON_GROUPS)  # their borders, too, must not meet
            assert not overlaps(groups), f"{where}: button groups {overlaps(groups)}"
    assert len(seen) >= 6, f"the scroll went past the messages' buttons (copy, edit, retry): {sorted(seen)}"
    page_controls = visible_controls(tab, "#owlet-status-row") + visible_controls(tab, "#owlet-input")
    assert not overlaps(page_controls), overlaps(page_controls)
    ARTIFACTS.mkdir(exist_ok=True)
    tab.screenshot(path=str(ARTIFACTS / f"ui-conversation-{tab.size_name}.png"))


def on_view_message_centres(tab, scroller: str) -> list[tuple[float, float]]:
    """The centre of what shows of each message inside the scrolling box."""
    return tab.evaluate("""([scroller, rows]) => {
        const box = document.querySelector(scroller).getBoundingClientRect();
        return [...document.querySelectorAll(rows)].map(e => e.getBoundingClientRect()).filter(
            r => r.bottom > box.top + 1 && r.top < box.bottom - 1).map(r => [
            (Math.max(r.left, box.left) + Math.min(r.right, box.right)) / 2,
            (Math.max(r.top, box.top) + Math.min(r.bottom, box.bottom)) / 2]);
    }""", [scroller, f"{USER}, {BOT}"])


def test_the_status_line_speaks_to_visitors_with_the_figures_on_demand(tab, tmp_path):
    tab.locator("#owlet-input input[type=file]").set_input_files(str(make_image(tmp_path / "red.png")))
    tab.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
    _seen, status = ask(tab, "What colour is the shape?")
    assert re.fullmatch(r"Answered in \d+(\.\d\d?)? s(, .+)?\s*details", status.strip()), status
    for developer_word in ("token", "cache", "First"):
        assert developer_word not in status, status
    figures = tab.locator("#owlet-status details.owlet-figures")
    assert "tokens/s" in figures.text_content(), "the figures are there, closed (innerText leaves hidden text out)"
    figures.locator("summary").click()
    opened = tab.locator("#owlet-status").inner_text()
    assert re.search(r"First token \d+\.\d\d s · [\d.]+ tokens/s · \d+ tokens · session cache (hit|miss)", opened), \
        opened

    # A refusal says what is wrong with the picture and what to do, in the status line and under the question.
    huge = make_image(tmp_path / "huge.png", size=(5000, 5000))
    tab.locator("#owlet-input input[type=file]").set_input_files(str(huge))
    tab.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
    tab.locator("#owlet-input textarea").fill("And this one?")
    tab.locator("#owlet-input textarea").press("Enter")
    tab.wait_for_function("document.querySelector('#owlet-status').innerText.startsWith('This picture is too large: "
                          "5000×5000 pixels')", timeout=30_000)
    assert "Please send a smaller one." in tab.locator("#owlet-status").inner_text()
