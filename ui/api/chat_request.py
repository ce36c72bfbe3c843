"""Read an OpenAI ``POST /v1/chat/completions`` body into what Owlet does with it, or refuse it with a sentence.

What maps onto Owlet: ``model`` (must be the served one), ``messages`` (``system`` / ``developer``, ``user`` and
``assistant``; content as a string or as ``text`` and ``image_url`` parts), ``max_completion_tokens`` /
``max_tokens``, ``temperature``, ``top_p``, ``stop``, ``seed``, ``stream`` and ``stream_options.include_usage``
(``engine.sampling_params.SamplingParams``), and vLLM's ``ignore_eos`` (benchmark tools send it for answers of a
fixed length) and ``repetition_penalty`` (omitted: the checkpoint's own, from its generation_config.json). What
Owlet does not do is refused with 400, never ignored: ``n`` > 1, tools and functions, ``response_format`` other than
text, log probabilities, presence and frequency penalties, logit bias, audio, and any parameter it does not know.
``user``, ``metadata``, ``service_tier`` and ``parallel_tool_calls`` change nothing an answer depends on and are
accepted.

Pictures come only as ``data:`` URLs (base64). Owlet never fetches a URL a stranger names, so an ``http(s)`` picture is
refused; one over the upload limit is 413 before it is decoded. The pixels are checked later, exactly as an upload's
(``ui.uploads.image_check``). A message holds at most one picture, placed before its text, as on the page.
"""
from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.sampling_params import MAX_REPETITION_PENALTY, SEED_MAX, SEED_MIN
from ui.api.errors import ApiError
from ui.shared import wording
from ui.uploads.image_check import too_large_message

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOP_STRINGS = 4
MAX_TEMPERATURE = 2.0
# Accepted with any value: they change nothing an answer depends on.
NO_EFFECT = frozenset({"user", "metadata", "service_tier", "parallel_tool_calls"})
# What Owlet does not do, with the value that asks for nothing (accepted) and the sentence for anything else.
UNSUPPORTED = {
    "tools": ((None, []), "Owlet does not call tools."),
    "tool_choice": ((None, "none"), "Owlet does not call tools."),
    "functions": ((None, []), "Owlet does not call functions."),
    "function_call": ((None, "none"), "Owlet does not call functions."),
    "response_format": ((None, {"type": "text"}), "Owlet answers in plain text only (no JSON mode or schema)."),
    "logprobs": ((None, False), "Owlet does not return log probabilities."),
    "top_logprobs": ((None,), "Owlet does not return log probabilities."),
    "presence_penalty": ((None, 0, 0.0), "Owlet does not apply presence or frequency penalties."),
    "frequency_penalty": ((None, 0, 0.0), "Owlet does not apply presence or frequency penalties."),
    "logit_bias": ((None, {}), "Owlet does not apply a logit bias."),
    "store": ((None, False), "Owlet does not store completions for later retrieval."),
    "modalities": ((None, ["text"]), "Owlet answers in text only."),
    "audio": ((None,), "Owlet answers in text only."),
    "prediction": ((None,), "Owlet does not take predicted outputs."),
    "reasoning_effort": ((None,), "Owlet's models take no reasoning effort."),
    "verbosity": ((None,), "Owlet's models take no verbosity setting."),
    "web_search_options": ((None,), "Owlet does not search the web."),
}
KNOWN = frozenset({"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
                   "stream", "stream_options", "n", "ignore_eos", "repetition_penalty"}) | NO_EFFECT | \
    frozenset(UNSUPPORTED)
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,", re.IGNORECASE)
_WHITESPACE = re.compile(rb"\s+")
NO_URLS = ("Owlet does not fetch pictures from URLs: a public server must not download what strangers name. Send the "
           "picture itself as a data: URL (data:image/png;base64,...).")


@dataclass(frozen=True)
class ApiMessage:
    role: str  # system, user or assistant
    text: str
    picture: bytes | None = None  # the bytes its data: URL carried, not yet checked


@dataclass(frozen=True)
class RequestLimits:
    """The page's limits an API request is held to (``ui.config.UIConfig``)."""
    max_new_tokens: int  # the default answer length
    max_new_tokens_cap: int  # the longest answer a request may ask for
    temperature: float  # the default temperature (the page's: greedy)
    max_text_chars: int  # the question's length
    max_picture_bytes: int  # a picture's bytes (the upload limit)

    @classmethod
    def from_config(cls, config) -> "RequestLimits":
        return cls(config.max_new_tokens, config.max_new_tokens_cap, config.temperature, config.max_text_chars,
                   config.max_upload_bytes)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: tuple[ApiMessage, ...]
    sampling: dict = field(default_factory=dict)  # SamplingParams fields
    stream: bool = False
    include_usage: bool = False


def parse_chat_request(body: object, limits: RequestLimits) -> ChatRequest:
    """The request, checked; raises ``ApiError`` (400, or 413 for a picture over the limit) naming the problem."""
    if not isinstance(body, Mapping):
        raise ApiError(400, "The request body must be a JSON object.")
    unknown = sorted(set(body) - KNOWN)
    if unknown:
        raise ApiError(400, f"Unrecognized request argument supplied: {unknown[0]}.", "unknown_parameter", unknown[0])
    for name, (allowed, sentence) in UNSUPPORTED.items():
        if name in body and not any(body[name] == value and type(body[name]) is type(value) for value in allowed):
            raise ApiError(400, sentence, "unsupported_parameter", name)
    n = body.get("n")
    if n is not None and (not _is_int(n) or n != 1):
        raise ApiError(400, "Owlet gives one answer per request: n must be 1.", "unsupported_parameter", "n")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError(400, "model is required: the name GET /v1/models lists.", "missing_parameter", "model")
    stream = _flag(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise ApiError(400, "stream_options is only allowed with stream: true.", "invalid_parameter",
                           "stream_options")
        if not isinstance(options, Mapping) or set(options) - {"include_usage"}:
            raise ApiError(400, "stream_options takes only include_usage.", "invalid_parameter", "stream_options")
        include_usage = _flag(options, "include_usage", "stream_options.include_usage")
    return ChatRequest(model, _messages(body.get("messages"), limits), _sampling(body, limits), stream, include_usage)


def _messages(raw, limits: RequestLimits) -> tuple[ApiMessage, ...]:
    if not isinstance(raw, list) or not raw:
        raise ApiError(400, "messages must be a non-empty list.", "invalid_parameter", "messages")
    messages = tuple(_message(m, i, limits) for i, m in enumerate(raw))
    last = messages[-1]
    if last.role != "user":
        raise ApiError(400, "The last message must be the user's question.", "invalid_parameter", "messages")
    if len(last.text) > limits.max_text_chars:
        raise ApiError(400, wording.too_long(limits.max_text_chars), "text_too_long", "messages")
    if not last.text.strip() and last.picture is None:
        raise ApiError(400, "The last message is empty: ask a question, or send a picture to ask about.",
                       "invalid_parameter", "messages")
    return messages


def _message(raw, i: int, limits: RequestLimits) -> ApiMessage:
    where = f"messages[{i}]"
    if not isinstance(raw, Mapping):
        raise ApiError(400, f"{where} must be an object with a role and content.", "invalid_parameter", where)
    role = raw.get("role")
    if role in ("tool", "function") or raw.get("tool_calls") or raw.get("function_call"):
        raise ApiError(400, "Owlet does not call tools: messages of tools and tool calls are not supported.",
                       "unsupported_parameter", where)
    if role not in ROLES:
        raise ApiError(400, f"{where}.role must be system, developer, user or assistant.", "invalid_parameter", where)
    extra = sorted(set(raw) - {"role", "content", "refusal"})
    if extra or raw.get("refusal"):
        raise ApiError(400, f"{where}: Owlet does not take {(extra or ['refusal'])[0]!r} on a message.",
                       "unsupported_parameter", where)
    texts, pictures = _content(raw.get("content"), where, limits)
    if pictures and ROLES[role] != "user":
        raise ApiError(400, f"{where}: only the user's messages may carry a picture.", "invalid_parameter", where)
    if len(pictures) > 1:
        raise ApiError(400, f"{where}: one picture per message (send each in a message of its own).",
                       "invalid_parameter", where)
    return ApiMessage(ROLES[role], "\n".join(texts), pictures[0] if pictures else None)


def _content(content, where: str, limits: RequestLimits) -> tuple[list[str], list[bytes]]:
    if isinstance(content, str):
        return [content], []
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of text and image_url parts.",
                       "invalid_parameter", where)
    texts, pictures = [], []
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if isinstance(image, Mapping) and (set(image) - {"url", "detail"} or
                                               image.get("detail") not in (None, "auto", "low", "high")):
                raise ApiError(400, f"{where}: image_url takes url and detail (auto, low or high).",
                               "invalid_parameter", where)
            pictures.append(picture_bytes(url, where, limits))
        else:
            raise ApiError(400, f"{where}: each content part must be {{\"type\": \"text\", \"text\": ...}} or "
                                f"{{\"type\": \"image_url\", \"image_url\": {{\"url\": \"data:...\"}}}}.",
                           "invalid_parameter", where)
    return texts, pictures


def picture_bytes(url, where: str, limits: RequestLimits) -> bytes:
    """The bytes of a base64 ``data:`` URL; refuses other URLs (400), a picture over the limit (413) before it is
    decoded, and data that is not base64 (400)."""
    if not isinstance(url, str) or not url:
        raise ApiError(400, f"{where}: image_url needs a url.", "invalid_parameter", where)
    match = _DATA_URL.match(url[:256])
    if match is None:
        if url[:5].lower() == "data:":
            raise ApiError(400, f"{where}: a picture's data: URL must be base64 (data:image/png;base64,...).",
                           "invalid_image", where)
        raise ApiError(400, NO_URLS, "image_url_not_allowed", where)
    mime = (match.group("mime") or "").lower()
    if not mime.startswith("image/"):
        raise ApiError(400, f"{where}: the data: URL must hold an image (image/png, image/jpeg, image/webp, "
                            f"image/gif or image/bmp), not {mime or 'untyped data'}.", "invalid_image", where)
    encoded = url[match.end():].encode("ascii", "replace")
    if len(encoded) > 4 * (limits.max_picture_bytes // 3 + 1) + len(encoded) // 64 + 64:  # room for line breaks
        raise ApiError(413, too_large_message(len(encoded) * 3 // 4, limits.max_picture_bytes), "image_too_large",
                       where)
    try:
        data = base64.b64decode(_WHITESPACE.sub(b"", encoded), validate=True)
    except (binascii.Error, ValueError):
        raise ApiError(400, f"{where}: the picture's data is not valid base64.", "invalid_image", where) from None
    if len(data) > limits.max_picture_bytes:
        raise ApiError(413, too_large_message(len(data), limits.max_picture_bytes), "image_too_large", where)
    if not data:
        raise ApiError(400, f"{where}: the picture is empty.", "invalid_image", where)
    return data


def _sampling(body: Mapping, limits: RequestLimits) -> dict:
    sampling = {"max_new_tokens": _max_tokens(body, limits), "temperature": limits.temperature}
    temperature = body.get("temperature")
    if temperature is not None:
        if not _is_number(temperature) or not 0 <= temperature <= MAX_TEMPERATURE:
            raise ApiError(400, f"temperature must be a number from 0 to {MAX_TEMPERATURE:g}.", "invalid_parameter",
                           "temperature")
        sampling["temperature"] = float(temperature)
    top_p = body.get("top_p")
    if top_p is not None:
        if not _is_number(top_p) or not 0 < top_p <= 1:
            raise ApiError(400, "top_p must be a number above 0 and at most 1.", "invalid_parameter", "top_p")
        sampling["top_p"] = float(top_p)
    seed = body.get("seed")
    if seed is not None:
        if not _is_int(seed) or not SEED_MIN <= seed <= SEED_MAX:
            raise ApiError(400, f"seed must be an integer from {SEED_MIN} to {SEED_MAX}.", "invalid_parameter",
                           "seed")
        sampling["seed"] = seed
    if _flag(body, "ignore_eos"):
        sampling["ignore_eos"] = True
    penalty = body.get("repetition_penalty")
    if penalty is not None:
        if not _is_number(penalty) or not 0 < penalty <= MAX_REPETITION_PENALTY:
            raise ApiError(400, f"repetition_penalty must be a number above 0 and at most {MAX_REPETITION_PENALTY:g}.",
                           "invalid_parameter", "repetition_penalty")
        sampling["repetition_penalty"] = float(penalty)
    stop = body.get("stop")
    if stop is not None:
        stops = [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or len(stops) > MAX_STOP_STRINGS or \
                not all(isinstance(s, str) and s for s in stops):
            raise ApiError(400, f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} of them.",
                           "invalid_parameter", "stop")
        if stops:
            sampling["stop"] = list(stops)
    return sampling


def _max_tokens(body: Mapping, limits: RequestLimits) -> int:
    given = {name: body[name] for name in ("max_completion_tokens", "max_tokens") if body.get(name) is not None}
    for name, value in given.items():
        if not _is_int(value) or value < 1:
            raise ApiError(400, f"{name} must be a positive integer.", "invalid_parameter", name)
        if value > limits.max_new_tokens_cap:
            raise ApiError(400, f"{name} is {value}; this server answers with at most {limits.max_new_tokens_cap} "
                                "tokens.", "invalid_parameter", name)
    if len(set(given.values())) > 1:
        raise ApiError(400, "max_tokens and max_completion_tokens differ; send one of them.", "invalid_parameter",
                       "max_tokens")
    return next(iter(given.values()), limits.max_new_tokens)


def _flag(body: Mapping, name: str, where: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"{where or name} must be true or false.", "invalid_parameter", where or name)
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
