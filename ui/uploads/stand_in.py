"""The stand-in the page's script uploads in place of a picture over the upload limit (``ui.page_script``).

A small PNG (what the box shows as the picture's thumbnail: a crossed-out frame) followed by ``MARK`` and the
picture's size in bytes. The check of every upload (``ui.uploads.image_check``) reads the size back and refuses the
turn with the same sentence as any picture over the limit ("This picture is too large: 11.0 MB; …"), so the visitor
is told in the chat and gets no answer, where Gradio's own check dropped the picture and sent the question alone.
Anyone can upload such a file; all it ever gets is that refusal.
"""
from __future__ import annotations

import functools
import io

MARK = "owlet-stand-in:too-large:"
_MARK = MARK.encode()
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MOST_DIGITS = 16


@functools.cache
def stand_in_picture() -> bytes:
    """The stand-in's picture: 64x64, a grey frame crossed out."""
    from PIL import Image, ImageDraw

    picture = Image.new("RGB", (64, 64), (236, 236, 236))
    draw = ImageDraw.Draw(picture)
    draw.rectangle((6, 6, 57, 57), outline=(150, 150, 150), width=3)
    draw.line((14, 50, 50, 14), fill=(190, 60, 60), width=5)
    out = io.BytesIO()
    picture.save(out, format="PNG")
    return out.getvalue()


def stood_in_for(data: bytes) -> int | None:
    """The size of the picture ``data`` stands in for, if ``data`` is a stand-in; None otherwise."""
    if not data.startswith(_PNG_SIGNATURE):
        return None
    head, found, digits = bytes(data[-(len(_MARK) + _MOST_DIGITS):]).rpartition(_MARK)
    if not found or not digits.isdigit():
        return None
    return int(digits)
