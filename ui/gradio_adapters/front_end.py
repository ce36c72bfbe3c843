"""What the page's style and script name of Gradio's front end, checked against the bundle Gradio serves.

The page hides Gradio's progress counters, the chat's trash and a picture's Share button, follows the conversation
in its own way and sends a stand-in for a picture over the upload limit (``ui.page_style``, ``ui.page_script``).
Each of these names something in Gradio's compiled front end: an attribute, a class, an icon, the upload request.
A Gradio whose front end no longer has one of them would show the counters again, or drop a picture silently, so
the page checks at start-up, through the registry, that the bundle still holds each name
(``check_front_end``).
"""
from __future__ import annotations

from pathlib import Path

from ui.gradio_adapters.internals import NotAdaptable
from ui.page_script import CHAT_SCROLLER, USER_ROW
from ui.page_style import SHARE_ICON, STATUS_TRACKER

# (what it is, text the bundle must hold)
NAMES = (
    ("the progress and queue counters' element", STATUS_TRACKER.strip("[]")),
    ("the chat's buttons above its messages", "top-panel"),
    ("a message's buttons", "message-buttons"),
    ("the Share button's icon", SHARE_ICON),
    ("the empty chat's placeholder", "placeholder-content"),
    ("the chat's scrolling box", CHAT_SCROLLER.split(".")[-1]),
    ("a message's row", USER_ROW),
    ("an example's card", "gallery-item"),
    ("the upload request", "this.upload_files("),
    ("the upload request's file field", "append(`files`"),
    ("a BrowserState kept in localStorage under its storage_key", "localStorage.getItem(s.props.storage_key)"),
)


def bundle_files() -> list[Path]:
    """Gradio's compiled front end (its JavaScript files), as served."""
    import gradio

    assets = Path(gradio.__file__).parent / "templates" / "frontend" / "assets"
    files = sorted(assets.glob("*.js"))
    if not files:
        raise NotAdaptable(f"Gradio's front end is not at {assets}")
    return files


def check_front_end(texts=None) -> None:
    """``NotAdaptable`` naming what the page relies on and Gradio's front end no longer has. ``texts``: the
    bundle's files' texts (default: read one at a time, until every name is found)."""
    if texts is None:
        texts = (path.read_text(encoding="utf-8", errors="replace") for path in bundle_files())
    missing = dict(NAMES)  # what it is -> its name, until found
    for text in texts:
        missing = {what: name for what, name in missing.items() if name not in text}
        if not missing:
            return
    raise NotAdaptable("Gradio's front end no longer has " + "; ".join(missing))
