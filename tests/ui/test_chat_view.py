"""Rendering stored turns as chat messages, and reading both browser and API message shapes."""
from __future__ import annotations

from ui.chat_view import IMAGE_PLACEHOLDER, message_text, parse_input, render_history


def test_one_message_per_turn_so_indices_match_the_history():
    turns = [{"role": "user", "text": "what is it?", "image_sha": "abc"},
             {"role": "assistant", "text": "a circle"},
             {"role": "user", "text": "colour?", "image_sha": None},
             {"role": "assistant", "text": "red"}]
    messages = render_history(turns, {"abc": "/tmp/a.png"})
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
    assert messages[0]["content"] == [{"path": "/tmp/a.png", "mime_type": "image/png"}, "what is it?"]
    assert messages[2]["content"] == ["colour?"] and messages[3]["content"] == "red"


def test_image_whose_file_is_gone_shows_a_placeholder():
    messages = render_history([{"role": "user", "text": "hi", "image_sha": "zzz"}], {})
    assert messages[0]["content"] == [IMAGE_PLACEHOLDER, "hi"]


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
