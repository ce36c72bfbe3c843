"""Errors raised to callers of the client; each carries a ``user_message`` safe to show in the UI."""
from __future__ import annotations


class OwletError(Exception):
    """Base class. ``user_message`` says what happened and what the user can do about it; ``retry_after_s``, when
    known, how many seconds until asking again can succeed (a rate limit's or quota's window)."""

    user_message = "Something went wrong. Please try again."
    retry_after_s: float | None = None

    def __init__(self, user_message: str | None = None):
        if user_message:
            self.user_message = user_message
        super().__init__(self.user_message)


class UserCapReached(OwletError):
    user_message = "You already have the maximum number of questions waiting. Wait for one to finish, then ask again."


class ServiceBusy(OwletError):
    user_message = "The service is busy, try again in a moment."


class NotYourConversation(OwletError):
    user_message = "This conversation does not exist or belongs to someone else. Start a new conversation."


class ConversationCleared(NotYourConversation):
    """The conversation gave way to the service's history budget (least recently used first); told to its owner
    only, anyone else hears ``NotYourConversation``."""

    user_message = "This conversation was cleared to make room for new ones; start again with a picture."


class ConversationBusy(OwletError):
    user_message = "This conversation is still answering. Wait for the answer or cancel it first."


class ImageMissing(OwletError):
    user_message = "The image has expired or was never uploaded. Please upload it again."


class InvalidInput(OwletError):
    """Bad text, image or sampling parameters; the message names the problem."""


class UnknownJob(OwletError):
    user_message = "This answer is no longer available (unknown or expired job)."


class ClientBusy(OwletError):
    """Too many questions waiting or running from one client address (or one login)."""

    user_message = ("Too many questions from your network are waiting or being answered. Wait for one to finish, "
                    "then ask again.")


class RateLimited(OwletError):
    user_message = "Too many questions from your network in a short time. Please wait a minute, then ask again."


class QuotaExceeded(OwletError):
    user_message = ("You have uploaded too many images recently. Ask about an image you already sent, or try "
                    "again later.")


class ImageStoreFull(OwletError):
    """The images stored for everyone within the image TTL reached the service's total: new pictures wait."""

    user_message = ("The service is holding as many new pictures as it can right now. Ask about a picture you "
                    "already sent, ask without one, or try again later.")


class TextQuotaExceeded(OwletError):
    """More text stored for one identity or client group within the text-quota window than it allows."""

    user_message = ("You have sent a lot of text in the last day: long questions and long conversations add up "
                    "to a daily limit. Please try again later.")
