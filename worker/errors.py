"""Errors raised to callers of the client; each carries a ``user_message`` safe to show in the UI.

Each error also says, once, how the edges report it: ``metric_kind`` labels the page's ``owlet_ui_errors`` metric,
``http_status`` and ``api_code`` are the OpenAI-compatible API's status and ``code`` (``ui.api.errors``). A new
error declares all three (tests/api/test_errors.py checks every subclass).
"""
from __future__ import annotations


class OwletError(Exception):
    """Base class. ``user_message`` says what happened and what the user can do about it; ``retry_after_s``, when
    known, how many seconds until asking again can succeed (a rate limit's or quota's window)."""

    user_message = "Something went wrong. Please try again."
    retry_after_s: float | None = None
    metric_kind: str | None = None  # the base class is never raised: every subclass names its own
    http_status: int | None = None
    api_code: str | None = None

    def __init__(self, user_message: str | None = None):
        if user_message:
            self.user_message = user_message
        super().__init__(self.user_message)


class UserCapReached(OwletError):
    user_message = "You already have the maximum number of questions waiting. Wait for one to finish, then ask again."
    metric_kind, http_status, api_code = "user_cap", 429, "identity_cap"


class ServiceBusy(OwletError):
    user_message = "The service is busy, try again in a moment."
    metric_kind, http_status, api_code = "busy", 503, "busy"


class NotYourConversation(OwletError):
    user_message = "This conversation does not exist or belongs to someone else. Start a new conversation."
    metric_kind, http_status, api_code = "not_your_conversation", 400, "conversation_not_found"


class ConversationCleared(NotYourConversation):
    """The conversation gave way to the service's history budget (least recently used first); told to its owner
    only, anyone else hears ``NotYourConversation``."""

    user_message = "This conversation was cleared to make room for new ones; start again with a picture."
    metric_kind, http_status, api_code = "conversation_cleared", 400, "conversation_cleared"


class ConversationBusy(OwletError):
    user_message = "This conversation is still answering. Wait for the answer or cancel it first."
    metric_kind, http_status, api_code = "conversation_busy", 429, "conversation_busy"


class ImageMissing(OwletError):
    user_message = "The image has expired or was never uploaded. Please upload it again."
    metric_kind, http_status, api_code = "image_missing", 400, "image_missing"


class InvalidInput(OwletError):
    """Bad text, image or sampling parameters; the message names the problem."""

    metric_kind, http_status, api_code = "invalid_input", 400, "invalid_input"


class UnknownJob(OwletError):
    user_message = "This answer is no longer available (unknown or expired job)."
    metric_kind, http_status, api_code = "unknown_job", 503, "job_expired"


class ClientBusy(OwletError):
    """Too many questions waiting or running from one client address (or one login)."""

    user_message = ("Too many questions from your network are waiting or being answered. Wait for one to finish, "
                    "then ask again.")
    metric_kind, http_status, api_code = "client_busy", 429, "address_cap"


class RateLimited(OwletError):
    user_message = "Too many questions from your network in a short time. Please wait a minute, then ask again."
    metric_kind, http_status, api_code = "rate_limited", 429, "turn_rate_limited"


class QuotaExceeded(OwletError):
    user_message = ("You have uploaded too many images recently. Ask about an image you already sent, or try "
                    "again later.")
    metric_kind, http_status, api_code = "quota", 429, "image_quota"


class ImageStoreFull(OwletError):
    """The images stored for everyone within the image TTL reached the service's total: new pictures wait."""

    user_message = ("The service is holding as many new pictures as it can right now. Ask about a picture you "
                    "already sent, ask without one, or try again later.")
    metric_kind, http_status, api_code = "image_store_full", 503, "image_store_full"


class TextQuotaExceeded(OwletError):
    """More text stored for one identity or client group within the text-quota window than it allows."""

    user_message = ("You have sent a lot of text in the last day: long questions and long conversations add up "
                    "to a daily limit. Please try again later.")
    metric_kind, http_status, api_code = "text_quota", 429, "text_quota"
