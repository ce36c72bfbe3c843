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
FILE_ROUTE = "/gradio_api/file="  # where Gradio serves files from its upload cache


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


def message_turns(turns: Iterable[Mapping]) -> list[int | None]:
    """For each message ``render_history`` shows, the index of the stored turn it stands for (None for a "no
    answer" mark): the chat's retry and edit events name a message, the stored history is cut at a turn."""
    indices: list[int | None] = []
    previous = None
    for i, turn in enumerate(turns):
        if turn.get("role") == "user" and previous == "user":
            indices.append(None)
        indices.append(i)
        previous = turn.get("role")
    return indices


def render_history(turns: Iterable[Mapping], image_paths: Mapping[str, str]) -> list[dict]:
    """Chat messages for stored turns ``{role, text, image_sha}``; images shown from this session's files."""
    messages = []
    for turn in turns:
        if turn.get("role") == "user" and messages and messages[-1]["role"] == "user":
            # A question that got no answer (stopped, failed): say so, rather than show it merged with the next.
            messages.append(assistant_message(NO_ANSWER))
        if turn.get("role") == "user":
            sha = turn.get("image_sha")
            messages.append(user_message(turn.get("text") or "", image_paths.get(sha) if sha else None,
                                         has_image=bool(sha)))
        else:
            messages.append(assistant_message(turn.get("text") or ""))
    return messages


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
