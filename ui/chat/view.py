"""Between the conversation history (Redis, the source of truth) and what the Chatbot shows.

The page renders one Chatbot message per conversation turn, so a message index from a retry or edit
event is also the turn index in the stored history. Inputs arrive in two shapes: the browser sends
content blocks (``[{"type": "text", "text": ...}]``) and ``gradio_client`` sends raw strings or dicts;
``message_text`` and ``parse_input`` accept both.

Messages are built directly in the Chatbot's wire format (what ``gr.Chatbot.postprocess`` would produce),
so the answer-streaming events can skip Gradio's post-processing of the whole conversation on every
update (``postprocess=False``): earlier messages are built once per turn and reused by every update.
An image is shown through the URL Gradio serves its upload from, without Gradio's file marker, because
Gradio re-checks (resolves, stats, compares against allowed folders) every marked file object on every
streamed update. Events that do post-process (page load) accept this format too.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from urllib.parse import quote

IMAGE_PLACEHOLDER = "🖼️ *(image)*"
NO_ANSWER = "*(no answer)*"
# Where Gradio serves files from its upload cache, relative to the page: a proxy serving the page under a path of its
# own (OWLET_UI_ROOT_PATH) serves the files under it too, and the browser resolves this against the page's address.
FILE_ROUTE = "gradio_api/file="


def text_block(text: str) -> dict:
    return {"type": "text", "text": text}


def image_block(path: str) -> dict:
    """An uploaded image (already in Gradio's upload cache), shown from Gradio's file route."""
    return {"type": "file", "alt_text": None,
            "file": {"path": path, "url": FILE_ROUTE + quote(path), "size": None, "orig_name": None,
                     "mime_type": "image/png", "is_stream": False}}


def user_message(text: str, image_path: str | None = None, has_image: bool = False) -> dict:
    """One chat message for a user turn: the image (if we still have its file) and the text together."""
    content: list = []
    if image_path:
        content.append(image_block(image_path))
    elif has_image:
        content.append(text_block(IMAGE_PLACEHOLDER))
    if text:
        content.append(text_block(text))
    return {"role": "user", "metadata": None, "content": content or [text_block("")], "options": None}


def assistant_message(text: str) -> dict:
    return {"role": "assistant", "metadata": None, "content": [text_block(text)], "options": None}


def then_asked(messages: list[dict], question: dict) -> list[dict]:
    """``messages`` followed by a new question; a last question that got no answer is marked so, not merged."""
    if messages and messages[-1]["role"] == "user":
        return messages + [assistant_message(NO_ANSWER), question]
    return messages + [question]


# What ``message_turns`` gives for a refused question and its reason: shown by this tab, never stored.
REFUSED = "refused"


def refusal(after: int, question: dict, reason: str) -> dict:
    """A question the service refused and the bubble under it that says why (``reason``), kept by the tab, never
    stored: it stays in the chat after the stored turn it followed (``after`` turns were stored then), so later
    turns still show why a picture or a question was not used."""
    return {"after": after, "question": question, "reason": reason}


def _in_chat_order(turns: list, refusals: Iterable[Mapping]):
    """``(turn index, turn)`` for each stored turn and ``(REFUSED, refusal)`` for each refusal, in the chat's order.
    A refusal anchored past the stored turns (they were cut back since) is not shown."""
    anchored: dict[int, list] = {}
    for item in refusals:
        anchored.setdefault(item["after"], []).append(item)
    for i in range(len(turns) + 1):
        for item in anchored.get(i, ()):
            yield REFUSED, item
        if i < len(turns):
            yield i, turns[i]


def _chat(turns: Iterable[Mapping], image_paths: Mapping[str, str], refusals: Iterable[Mapping]):
    """The chat's messages and, for each, the stored turn it stands for (None for a "no answer" mark, ``REFUSED``
    for a refused question and its reason)."""
    messages: list[dict] = []
    indices: list = []
    for index, item in _in_chat_order(list(turns), refusals):
        is_user = index == REFUSED or item.get("role") == "user"
        if is_user and messages and messages[-1]["role"] == "user":
            # A question that got no answer (stopped, failed): say so, rather than show it merged with the next.
            messages.append(assistant_message(NO_ANSWER))
            indices.append(None)
        if index == REFUSED:
            messages += [item["question"], assistant_message(item["reason"])]
            indices += [REFUSED, REFUSED]
        elif item.get("role") == "user":
            sha = item.get("image_sha")
            messages.append(user_message(item.get("text") or "", image_paths.get(sha) if sha else None,
                                         has_image=bool(sha)))
            indices.append(index)
        else:
            messages.append(assistant_message(item.get("text") or ""))
            indices.append(index)
    return messages, indices


def message_turns(turns: Iterable[Mapping], refusals: Iterable[Mapping] = ()) -> list:
    """For each message ``render_history`` shows, the index of the stored turn it stands for (None for a "no
    answer" mark, ``REFUSED`` for a refused question or its reason): the chat's retry and edit events name a
    message, the stored history is cut at a turn."""
    return _chat(turns, {}, refusals)[1]


def render_history(turns: Iterable[Mapping], image_paths: Mapping[str, str],
                   refusals: Iterable[Mapping] = ()) -> list[dict]:
    """Chat messages for stored turns ``{role, text, image_sha}``, images shown from this session's files, with the
    tab's refused questions (``refusal``) where they were asked."""
    return _chat(turns, image_paths, refusals)[0]


MAX_MESSAGE_DEPTH = 8  # a message is a dict of content blocks at most a few levels deep


def message_text(value, depth: int = 0) -> str:
    """The text of a chat message value in any shape: str, content blocks, a message dict, or a list of them.
    Nothing deeper than ``MAX_MESSAGE_DEPTH`` is read: a client sent 500 nested lists (1.2 KB) and the unbounded
    recursion logged a 145 KB traceback per call."""
    if value is None or depth > MAX_MESSAGE_DEPTH:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        if "content" in value:
            return message_text(value["content"], depth + 1)
        text = value.get("text") if value.get("type") == "text" or "text" in value else None
        return text if isinstance(text, str) else ""  # a file block, or text that is not text
    if isinstance(value, (list, tuple)):
        return "\n".join(t for t in (message_text(v, depth + 1) for v in value) if t)
    return ""


def parse_input(message) -> tuple[str, list[str]]:
    """(text, file paths) from a MultimodalTextbox value; a plain string means text only."""
    if message is None:
        return "", []
    if isinstance(message, str):
        return message.strip(), []
    text = str(message.get("text") or "").strip()
    files = []
    for f in message.get("files") or []:
        path = f if isinstance(f, str) else (f.get("path") if isinstance(f, Mapping) else getattr(f, "path", None))
        if path:
            files.append(path)
    return text, files
