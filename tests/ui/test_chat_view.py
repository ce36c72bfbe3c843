"""Rendering stored turns as chat messages, and reading both browser and API message shapes."""
from __future__ import annotations

import gradio as gr

from ui.chat.view import (FILE_ROUTE, IMAGE_PLACEHOLDER, REFUSED, assistant_message, message_text, message_turns,
                          parse_input, refusal, render_history, then_asked, user_message)


def test_one_message_per_turn_so_indices_match_the_history():
    turns = [{"role": "user", "text": "what is it?", "image_sha": "abc"},
             {"role": "assistant", "text": "a circle"},
             {"role": "user", "text": "colour?", "image_sha": None},
             {"role": "assistant", "text": "red"}]
    messages = render_history(turns, {"abc": "/tmp/a.png"})
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    image, question = messages[0]["content"]
    assert image["type"] == "file" and image["file"]["path"] == "/tmp/a.png"
    assert image["file"]["url"] == FILE_ROUTE + "/tmp/a.png" and question == {"type": "text", "text": "what is it?"}
    assert message_text(messages[2]) == "colour?" and message_text(messages[3]) == "red"


def test_image_whose_file_is_gone_shows_a_placeholder():
    messages = render_history([{"role": "user", "text": "hi", "image_sha": "zzz"}], {})
    assert [block["text"] for block in messages[0]["content"]] == [IMAGE_PLACEHOLDER, "hi"]


def test_messages_are_already_what_the_chatbot_would_send():
    """Answer events skip Gradio's post-processing, so messages must equal what it would produce (less the
    file marker, which only tells Gradio to re-check the file on every update)."""
    messages = [user_message("what is it?", "/tmp/a b.png"), assistant_message("a circle"),
                user_message("and now?", None, has_image=True), assistant_message("")]
    processed = gr.Chatbot().postprocess(messages).model_dump()
    for block in processed[0]["content"]:
        if block["type"] == "file":
            assert block["file"].pop("meta") == {"_type": "gradio.FileData"}
            block["file"]["url"] = FILE_ROUTE + "/tmp/a%20b.png"  # Gradio adds the URL when it serves the file
    assert processed == messages


def test_message_text_reads_browser_blocks_and_raw_values():
    browser = {"role": "user", "content": [{"type": "file", "file": {"path": "/x.png"}},
                                           {"type": "text", "text": "edited question"}]}
    assert message_text(browser) == "edited question"
    assert message_text("plain") == "plain"
    assert message_text([{"type": "text", "text": "a"}, "b"]) == "a\nb"
    assert message_text(None) == ""


def test_parse_input_accepts_both_shapes():
    assert parse_input({"text": " hi ", "files": ["/a.png"]}) == ("hi", ["/a.png"])
    assert parse_input({"text": "x", "files": [{"path": "/b.png", "meta": {}}]}) == ("x", ["/b.png"])
    assert parse_input("just text") == ("just text", [])
    assert parse_input(None) == ("", [])


def test_message_text_reads_no_deeper_than_a_message_nests():
    deep = "question"
    for _ in range(500):
        deep = [deep]
    assert message_text(deep) == "", "500 nested lists are not a message (and no RecursionError)"
    assert message_text([[{"type": "text", "text": "shallow"}]]) == "shallow"
    assert message_text({"text": {"not": "text"}}) == ""


def test_a_question_without_an_answer_is_not_merged_with_the_next():
    turns = [{"role": "user", "text": "stopped one"}, {"role": "user", "text": "next"},
             {"role": "assistant", "text": "answer"}]
    messages = render_history(turns, {})
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert message_text(messages[1]) == "*(no answer)*"
    assert message_turns(turns) == [0, None, 1, 2], "retry and edit name a message; history is cut at a turn"
    asked = then_asked(render_history(turns[:1], {}), user_message("next"))
    assert [m["role"] for m in asked] == ["user", "assistant", "user"]


def test_refused_questions_stay_where_they_were_asked():
    """A refused question (never stored) and its reason stay in the chat after the turn they followed, so the next
    turn does not take away why a picture was not used; retry and edit still name the stored turns."""
    turns = [{"role": "user", "text": "what is it?"}, {"role": "assistant", "text": "a circle"},
             {"role": "user", "text": "and now?"}, {"role": "assistant", "text": "red"}]
    refused = [refusal(2, user_message("this one?"), "⚠ This file is not an image we can read."),
               refusal(4, user_message("and this?"), "⚠ This picture is too large: 11.0 MB; the limit is 10.0 MB."),
               refusal(9, user_message("after a turn cut away"), "⚠ gone")]
    messages = render_history(turns, {}, refused)
    assert [message_text(m) for m in messages] == [
        "what is it?", "a circle", "this one?", "⚠ This file is not an image we can read.", "and now?", "red",
        "and this?", "⚠ This picture is too large: 11.0 MB; the limit is 10.0 MB."]
    assert message_turns(turns, refused) == [0, 1, REFUSED, REFUSED, 2, 3, REFUSED, REFUSED]
    assert render_history(turns, {}) == [m for i, m in enumerate(messages) if i not in (2, 3, 6, 7)]
    after_a_stopped_answer = render_history(turns[:3], {}, refused[1:2] + [refusal(3, user_message("x"), "⚠ no")])
    assert [m["role"] for m in after_a_stopped_answer][-3:] == ["assistant", "user", "assistant"], \
        "a question without an answer is marked so before a refusal, as before the next question"
