"""The worker client's calls the page's events make about a tab's chat and jobs, each answering something plain
(an empty chat, None, False) when Redis cannot say, so an event shows a sentence and never a traceback."""
from __future__ import annotations

import logging

from ui.chat.view import render_history
from ui.uploads.owners import UploadedPaths
from ui.uploads.restored_pictures import write_back
from worker.errors import UnknownJob

log = logging.getLogger("owlet.ui")


class PageReads:
    def __init__(self, client, uploads: UploadedPaths):
        self.client, self.uploads = client, uploads

    def shown(self, user, tab) -> tuple[list[dict], int]:
        """The chat as the tab shows it: the stored conversation as messages, with the tab's refused questions, and
        how many stored turns that is (none for a new chat, or if it cannot be read)."""
        turns = []
        if tab.get("conversation"):
            try:
                turns = self.client.history(user, tab["conversation"])
            except Exception:
                turns = []
        return render_history(turns, tab.get("images") or {}, tab.get("refusals") or []), len(turns)

    def pictures_back(self, caller, conv) -> dict[str, str]:
        """A reopened conversation's pictures as files this caller's address may be shown (sha256 -> path)."""
        try:
            return write_back(self.client.conversation_images(caller.user, conv), caller.address, self.uploads)
        except Exception:  # Redis unavailable, or the conversation just expired: placeholders then
            log.warning("could not show a reopened conversation's pictures", exc_info=True)
            return {}

    def first_answer(self, user) -> str | None:
        """The user's newest conversation while its first answer is still being made (None if Redis cannot say)."""
        if user is None:
            return None
        try:
            found = self.client.first_answer(user)
        except Exception:
            return None
        return found[0] if found else None

    def newest_since(self, user, since: float) -> str | None:
        """The user's newest chat if it was created after ``since``; None if Redis cannot say."""
        if user is None:
            return None
        try:
            return self.client.newest_since(user, since)
        except Exception:
            return None

    def leave(self, user, conv, at: float) -> None:
        """Record that ``user`` left ``conv`` with "New conversation" at ``at`` (nothing when Redis cannot: a reload
        before the browser keeps that it left then reopens it, as before)."""
        if user is None or not conv:
            return
        try:
            self.client.leave(user, conv, at)
        except Exception:
            log.warning("could not record that a chat was left", exc_info=True)

    def left_at(self, user, conv) -> float | None:
        """When ``user`` left ``conv`` with "New conversation" (None: never, or Redis cannot say)."""
        if user is None or not conv:
            return None
        try:
            return self.client.left_at(user, conv)
        except Exception:
            return None

    def pending_job(self, user, conv) -> str | None:
        """The job still answering the conversation's last question, if any (None if Redis cannot say)."""
        try:
            return self.client.pending_job(user, conv)
        except Exception:
            return None

    def cancel(self, user, job) -> bool:
        """True if ``job`` was live and is now cancelled; False if it had ended, is not ``user``'s, or Redis failed."""
        if not job:
            return False
        try:
            return bool(self.client.cancel(user, job))
        except UnknownJob:  # expired, or someone else's
            return False
        except Exception:
            log.warning("cancel of %s failed", job, exc_info=True)
            return False
