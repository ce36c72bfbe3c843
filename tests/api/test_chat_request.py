"""Reading an OpenAI chat completion body (``ui.api.chat_request``): what maps onto Owlet, and what is refused
with a status and a sentence rather than ignored."""
from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from ui.api.chat_request import NO_URLS, RequestLimits, parse_chat_request
from ui.api.errors import ApiError

LIMITS = RequestLimits(max_new_tokens=64, max_new_tokens_cap=256, temperature=0.0, max_text_chars=100,
                       max_picture_bytes=4096)


def png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def body(**fields) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi?"}], **fields}


def refusal(raw, status=400) -> ApiError:
    with pytest.raises(ApiError) as refused:
        parse_chat_request(raw, LIMITS)
    assert refused.value.status == status, refused.value.message
    return refused.value


def test_the_parameters_map_onto_sampling():
    chat = parse_chat_request(body(max_completion_tokens=32, temperature=0.7, top_p=0.9, seed=7, stop="END",
                                   stream=True, stream_options={"include_usage": True}, user="x", n=1), LIMITS)
    assert chat.sampling == {"max_new_tokens": 32, "temperature": 0.7, "top_p": 0.9, "seed": 7, "stop": ["END"]}
    assert chat.stream and chat.include_usage and chat.model == "m"
    assert parse_chat_request(body(max_tokens=16), LIMITS).sampling == {"max_new_tokens": 16, "temperature": 0.0}
    assert parse_chat_request(body(ignore_eos=True), LIMITS).sampling["ignore_eos"] is True, "vLLM's extension"
    assert parse_chat_request(body(repetition_penalty=1.1), LIMITS).sampling["repetition_penalty"] == 1.1, \
        "vLLM's extension too"
    assert "repetition_penalty" not in parse_chat_request(body(), LIMITS).sampling, "the checkpoint's own"
    assert parse_chat_request(body(), LIMITS).sampling == {"max_new_tokens": 64, "temperature": 0.0}, \
        "the page's defaults: its answer length, greedy"


def test_messages_roles_parts_and_pictures():
    picture = png()
    chat = parse_chat_request(body(messages=[
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What"}, {"type": "text", "text": "is it?"},
                                     {"type": "image_url", "image_url": {"url": data_url(picture), "detail": "high"}}]},
        {"role": "assistant", "content": [{"type": "text", "text": "a dot"}]},
        {"role": "user", "content": "Colour?"}]), LIMITS)
    assert [(m.role, m.text, m.picture) for m in chat.messages] == [
        ("system", "Be brief.", None), ("user", "What\nis it?", picture), ("assistant", "a dot", None),
        ("user", "Colour?", None)]


@pytest.mark.parametrize("fields, param", [
    ({"n": 2}, "n"), ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "response_format"), ({"logprobs": True}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"), ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logit_bias": {"1": 5}}, "logit_bias"), ({"frequency_penalty": 1}, "frequency_penalty"),
    ({"best_of": 2}, "best_of"), ({"max_tokens": 257}, "max_tokens"), ({"temperature": 2.5}, "temperature"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"), ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"seed": 1.5}, "seed"), ({"seed": 10**30}, "seed"), ({"seed": -2**63 - 1}, "seed"),
    ({"repetition_penalty": 0}, "repetition_penalty"), ({"repetition_penalty": 11}, "repetition_penalty"),
    ({"repetition_penalty": "1.1"}, "repetition_penalty"), ({"repetition_penalty": True}, "repetition_penalty"),
    ({"max_tokens": 8, "max_completion_tokens": 9}, "max_tokens"),
])
def test_what_owlet_does_not_do_is_refused_not_ignored(fields, param):
    error = refusal(body(**fields))
    assert error.param == param and error.message


def test_the_harmless_forms_of_unsupported_parameters_are_accepted():
    parse_chat_request(body(n=1, tools=None, tool_choice="none", response_format={"type": "text"}, logprobs=False,
                            presence_penalty=0, frequency_penalty=0.0, logit_bias={}, store=False), LIMITS)


def test_pictures_only_as_data_urls_checked_for_size_and_base64():
    def ask(url):
        return body(messages=[{"role": "user", "content": [
            {"type": "text", "text": "?"}, {"type": "image_url", "image_url": {"url": url}}]}])
    assert refusal(ask("https://example.org/cat.png")).message == NO_URLS
    assert refusal(ask("http://127.0.0.1/x.png")).code == "image_url_not_allowed"
    assert "not valid base64" in refusal(ask("data:image/png;base64,@@@not-base64@@@")).message
    too_big = refusal(ask(data_url(b"x" * 5000)), status=413)
    assert too_big.message.startswith("This picture is too large: 5 KB; the limit is"), too_big.message
    assert "must hold an image" in refusal(ask(data_url(png(), "text/html"))).message
    assert "must be base64" in refusal(ask("data:image/png,rawbytes")).message
    two = [{"type": "image_url", "image_url": {"url": data_url(png())}}] * 2
    assert "one picture per message" in refusal(body(messages=[{"role": "user", "content": two}])).message
    on_assistant = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [
        {"type": "image_url", "image_url": {"url": data_url(png())}}]}, {"role": "user", "content": "b"}]
    assert "only the user's messages" in refusal(body(messages=on_assistant)).message


def test_the_question_is_last_not_empty_and_within_the_page_text_limit():
    assert "longer than 100 characters" in refusal(body(messages=[{"role": "user", "content": "x" * 101}])).message
    assert "last message" in refusal(body(messages=[{"role": "user", "content": "a"},
                                                    {"role": "assistant", "content": "b"}])).message
    assert "empty" in refusal(body(messages=[{"role": "user", "content": "  "}])).message
    assert "tools" in refusal(body(messages=[{"role": "tool", "content": "x"}])).message
    refusal(body(messages=[]))
    refusal(["not", "an", "object"])
    assert refusal({"messages": [{"role": "user", "content": "a"}]}).param == "model"
