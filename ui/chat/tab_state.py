"""The ``tab`` state (a ``gr.State``, one per browser tab): its owner, conversation id, the job being answered
(so Stop can cancel it), its uploaded image files, and the refused questions it keeps showing."""
from __future__ import annotations

from ui.chat.view import refusal

REFUSALS_KEPT = 8  # refused questions a tab keeps showing with their reasons (ui.chat.view.refusal)


def new_tab_state() -> dict:
    return {"conversation": None, "job": None, "images": {}, "has_image": False, "refusals": []}


def with_refusal(tab: dict, after: int, question: dict, reason: str) -> dict:
    """``tab`` keeping one more refused question in its chat (the oldest give way past ``REFUSALS_KEPT``)."""
    kept = list(tab.get("refusals") or [])[-(REFUSALS_KEPT - 1):]
    return {**tab, "refusals": [*kept, refusal(after, question, reason)]}


def in_use(tab) -> bool:
    """Whether a tab has an owner, a chat or an answer: only a fresh one may be (re)loaded."""
    return isinstance(tab, dict) and any(tab.get(key) for key in ("user", "conversation", "job"))


def belongs_to_another(tab, user) -> bool:
    """Whether a tab is another identity's: a client can name any session hash, and then must not act
    on or learn about the chat behind it."""
    owner = tab.get("user") if isinstance(tab, dict) else None  # None: a tab nobody has used yet
    return owner not in (None, user)
