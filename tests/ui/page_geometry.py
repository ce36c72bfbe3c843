"""What a visitor sees of the page in a real browser: what is on screen without scrolling, which controls overlap,
and which characters would need an emoji font to be drawn."""
from __future__ import annotations

DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 390, "height": 844}
SIZES = {"desktop": DESKTOP, "phone": PHONE}

# Characters drawn as emoji by default (Unicode's Emoji_Presentation) below U+1F000, where most of them are;
# everything from U+1F000 up is emoji or pictographs too. Without an emoji font they are empty boxes.
_EMOJI_BELOW_1F000 = {
    0x231A, 0x231B, 0x23E9, 0x23EA, 0x23EB, 0x23EC, 0x23F0, 0x23F3, 0x25FD, 0x25FE, 0x2614, 0x2615,
    *range(0x2648, 0x2654), 0x267F, 0x2693, 0x26A1, 0x26AA, 0x26AB, 0x26BD, 0x26BE, 0x26C4, 0x26C5, 0x26CE, 0x26D4,
    0x26EA, 0x26F2, 0x26F3, 0x26F5, 0x26FA, 0x26FD, 0x2705, 0x270A, 0x270B, 0x2728, 0x274C, 0x274E, 0x2753, 0x2754,
    0x2755, 0x2757, 0x2795, 0x2796, 0x2797, 0x27B0, 0x27BF, 0x2B1B, 0x2B1C, 0x2B50, 0x2B55,
    0xFE0F,  # the selector that asks for an emoji rendering of the character before it
}


def needs_emoji_font(text: str) -> list[str]:
    """The characters of ``text`` that only an emoji font draws."""
    return sorted({c for c in text if ord(c) >= 0x1F000 or ord(c) in _EMOJI_BELOW_1F000})


def page_text(tab) -> str:
    """Everything the page writes for a visitor: its visible text, placeholders, labels and button titles."""
    return tab.evaluate("""() => [document.body.innerText,
        ...[...document.querySelectorAll('[placeholder],[aria-label],[title]')].flatMap(
            e => [e.getAttribute('placeholder'), e.getAttribute('aria-label'), e.getAttribute('title')])
    ].filter(Boolean).join('\\n')""")


def within_first_view(tab, selector: str) -> bool:
    """Whether the first element matching ``selector`` is wholly on screen without scrolling."""
    box = tab.locator(selector).first.bounding_box()
    size = tab.viewport_size
    return (box is not None and box["width"] > 0 and box["height"] > 0 and box["x"] >= 0 and box["y"] >= 0
            and box["x"] + box["width"] <= size["width"] and box["y"] + box["height"] <= size["height"])


def line_count(tab, selector: str) -> float:
    """How many lines of text the element takes: its height over its line height."""
    return tab.evaluate("""(selector) => {
        const e = document.querySelector(selector);
        const style = getComputedStyle(e);
        let line = parseFloat(style.lineHeight);
        if (isNaN(line)) line = 1.2 * parseFloat(style.fontSize);
        return e.getBoundingClientRect().height / line;
    }""", selector)


CONTROLS = ":is(button, a[href], input, textarea, [role=button])"
BUTTON_GROUPS = ".icon-button-wrapper"  # Gradio's bordered groups of icon buttons (the trash; a message's buttons)


def visible_controls(tab, within: str, kind: str = CONTROLS) -> list[dict]:
    """Each element of ``kind`` (by default: button, link, input, text box) on view under ``within``, as {name, x, y,
    width, height, covered}: the part of it on view, and whether something else is drawn over that part's centre.
    A control more than half scrolled out of its scrolling box, or off the screen, is not on view."""
    return tab.evaluate("""([scope, kind, leaves]) => {
        const clip = (r, o) => ({left: Math.max(r.left, o.left), top: Math.max(r.top, o.top),
                                 right: Math.min(r.right, o.right), bottom: Math.min(r.bottom, o.bottom)});
        const area = (r) => Math.max(0, r.right - r.left) * Math.max(0, r.bottom - r.top);
        const seen = [];
        for (const e of document.querySelectorAll(scope + ' ' + kind)) {
            if (leaves && e.querySelector(kind)) continue;  // a container of controls: its controls are counted
            const r = e.getBoundingClientRect();
            const style = getComputedStyle(e);
            if (r.width < 1 || r.height < 1 || style.visibility === 'hidden' || style.display === 'none'
                || parseFloat(style.opacity) === 0 || e.closest('[hidden]')) continue;
            if (e.type === 'file') continue;  // the hidden picker behind the upload button
            let shown = clip(r, {left: 0, top: 0, right: innerWidth, bottom: innerHeight});
            for (let box = e.parentElement; box; box = box.parentElement) {
                if (['auto', 'scroll', 'hidden'].includes(getComputedStyle(box).overflowY)
                    && box.scrollHeight > box.clientHeight) shown = clip(shown, box.getBoundingClientRect());
            }
            if (area(shown) < 0.5 * r.width * r.height) continue;  // mostly scrolled away: not on view
            // the element drawn at the centre of what shows must be it (or inside it): nothing lies over it
            const top = document.elementFromPoint((shown.left + shown.right) / 2, (shown.top + shown.bottom) / 2);
            const labels = [...e.querySelectorAll('[aria-label]')].map(b => b.getAttribute('aria-label')).join(' + ');
            const name = e.getAttribute('aria-label') || e.getAttribute('title') || e.innerText.trim().slice(0, 30)
                || labels || e.tagName.toLowerCase() + (e.className ? '.' + String(e.className).split(' ')[0] : '');
            seen.push({name, x: shown.left, y: shown.top, width: shown.right - shown.left,
                       height: shown.bottom - shown.top,
                       covered: !(top && (e === top || e.contains(top) || top.contains(e)))});
        }
        return seen;
    }""", [within, kind, kind == CONTROLS])


def overlaps(controls: list[dict]) -> list[tuple[str, str]]:
    """Pairs of controls whose boxes partly share an area (more than half a pixel each way). A control wholly inside
    another is drawn on it on purpose (the fullscreen button in a picture's corner), not knocked into it."""
    def inside(a, b):
        return (a["x"] >= b["x"] and a["y"] >= b["y"] and a["x"] + a["width"] <= b["x"] + b["width"]
                and a["y"] + a["height"] <= b["y"] + b["height"])

    found = []
    for i, a in enumerate(controls):
        for b in controls[i + 1:]:
            dx = min(a["x"] + a["width"], b["x"] + b["width"]) - max(a["x"], b["x"])
            dy = min(a["y"] + a["height"], b["y"] + b["height"]) - max(a["y"], b["y"])
            if dx > 0.5 and dy > 0.5 and not inside(a, b) and not inside(b, a):
                found.append((a["name"], b["name"]))
    return found
