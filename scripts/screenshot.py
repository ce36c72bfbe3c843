"""Make the README's screenshots from the real page: run the demo stack (its own Redis, a worker with the bundled
model, the page), and in headless Chromium at a laptop's size (1280x800) and a phone's (390x844) click the first
example picture, ask its suggested question and a follow-up, and capture the page as a visitor sees it.

    .venv/bin/python scripts/screenshot.py [--model models/owlet-shapes-vl] [--out docs]

Writes ``docs/screenshot-desktop.png`` and ``docs/screenshot-phone.png``, reduced to a small palette so they stay
small in the repository. Needs Chromium (``scripts/ensure_test_tools.sh``); no emoji font (the page draws its own
icons).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from owlet.demo import DEFAULT_MODEL, ROOT, Stack

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
SIZES = {"desktop": {"width": 1280, "height": 800}, "phone": {"width": 390, "height": 844}}
FOLLOW_UP = "How many shapes?"  # a form the demo model was trained on (training/dialogues.py)
EXAMPLE = "#owlet-examples .gallery-item, #owlet-examples tr.tr-body, #owlet-examples button.example"
PALETTE_COLOURS = 256


def ask(page, text: str, timeout_s: float = 120) -> None:
    """Send a question and wait until its answer is in and the input box is open again."""
    bots = page.locator("#owlet-chat .message-row.bot-row")
    before = bots.count()
    box = page.locator("#owlet-input textarea")
    box.fill(text)
    box.press("Enter")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answered = bots.count() > before and "Answered in" in page.locator("#owlet-status").inner_text()
        if answered and not box.is_disabled():
            return
        time.sleep(0.05)
    raise TimeoutError(f"no answer to {text!r}")


def capture(browser, url: str, size: dict, out: Path) -> None:
    page = browser.new_context(viewport=size).new_page()
    page.goto(url)
    page.wait_for_selector("#owlet-input textarea", timeout=60_000)
    page.locator(EXAMPLE).first.click()  # fills the box with a picture and its suggested question
    page.wait_for_selector("#owlet-input img, #owlet-input .thumbnail-item", timeout=30_000)
    ask(page, page.locator("#owlet-input textarea").input_value())
    ask(page, FOLLOW_UP)
    page.evaluate("window.scrollTo(0, 0)")
    time.sleep(0.5)  # the last updates settle
    page.screenshot(path=str(out))
    page.context.close()


def shrink(path: Path) -> None:
    """Keep the picture small: a palette of ``PALETTE_COLOURS`` colours is plenty for a page of text."""
    from PIL import Image

    with Image.open(path) as image:
        reduced = image.convert("RGB").quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT)
    reduced.save(path, optimize=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="folder for the two screenshots")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--port", type=int, default=7899)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    # A fresh Redis and upload folder of the stack's own, removed afterwards: the pictures show a first visit.
    with tempfile.TemporaryDirectory(prefix="owlet-screenshot-") as scratch, \
            Stack(None, args.model, "127.0.0.1", args.port, [], worker_concurrency=4,
                  uploads_dir=Path(scratch) / "uploads") as stack, sync_playwright() as p:
        stack.wait_ready(300)
        browser = p.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        for name, size in SIZES.items():
            out = args.out / f"screenshot-{name}.png"
            capture(browser, stack.url, size, out)
            shrink(out)
            print(f"wrote {out} ({out.stat().st_size // 1024} KiB)")
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
