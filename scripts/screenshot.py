"""Regenerate docs/screenshot.png: run the demo stack, click the page's first example picture in headless
Chromium, ask its suggested question and two follow-ups, and capture the page.

    python scripts/screenshot.py [--model models/owlet-shapes-vl] [--out docs/screenshot.png]

Needs Chromium (`scripts/ensure_test_tools.sh`), and Debian's `fonts-noto-color-emoji` for the title's and the
attach button's emoji (without it they render as empty boxes; the tests do not need it).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from owlet.demo import DEFAULT_MODEL, ROOT, Stack

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
# Follow-ups in forms the demo model was trained on (training/dialogues.py, training/phrasings.py).
QUESTIONS = ("How many shapes?", "What color is the circle?")


def ask(page, text: str, timeout_s: float = 120) -> None:
    """Send a question and wait until its answer is in and the input box is open again."""
    bots = page.locator("#owlet-chat .message-row.bot-row")
    before = bots.count()
    box = page.locator("#owlet-input textarea")
    box.fill(text)
    box.press("Enter")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answered = bots.count() > before and "First token" in page.locator("#owlet-status").inner_text()
        if answered and not box.is_disabled():
            return
        time.sleep(0.05)
    raise TimeoutError(f"no answer to {text!r}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshot.png")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--port", type=int, default=7899)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with Stack(None, args.model, "127.0.0.1", args.port, [], worker_concurrency=18) as stack, sync_playwright() as p:
        stack.wait_ready(300)
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1100, "height": 1250})
        page.goto(stack.url)
        page.wait_for_selector("#owlet-input textarea", timeout=60_000)
        page.locator("#owlet-examples .gallery-item, #owlet-examples tr.tr-body").first.click()  # fills the box with a picture and a question
        page.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
        ask(page, page.locator("#owlet-input textarea").input_value())
        for question in QUESTIONS:
            ask(page, question)
        time.sleep(0.5)
        page.screenshot(path=str(args.out))
        browser.close()
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
