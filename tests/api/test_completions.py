"""The OpenAI-compatible API end to end, against a real stack, driven by the official ``openai`` package: answers
equal the page's for the same conversation (fp32), whole and streamed; a stateless conversation with a picture hits
the session cache on its follow-ups; the model list; a client that leaves mid-stream cancels its job."""
from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
from gradio_client import Client

from tests.api.conftest import ANSWER_TOKENS, METRICS_TOKEN, data_url, new_key, openai_client
from tests.ui.page_client import ask, bubble_text, engine_running
from tests.ui.stack import make_image, stack_redis, tiny_model

pytestmark = pytest.mark.timeout(300)


def served_model(stack) -> str:
    (model,) = [m.id for m in openai_client(stack).models.list().data]
    return model


def page_conversation(stack, picture, questions) -> list[str]:
    """The page's answers, through its own API (gradio_client), to ``questions`` about ``picture``."""
    client = Client(stack.url, verbose=False)
    answers = []
    for i, question in enumerate(questions):
        _outputs, (_box, chat, status) = ask(client, question, picture if i == 0 else None, ANSWER_TOKENS)
        assert "First token" in status, status
        answers.append(bubble_text(chat[-1]))
    return answers


def test_models_lists_the_served_checkpoint(stack):
    client = openai_client(stack)
    assert served_model(stack) == tiny_model().name, "the checkpoint's folder name, from the workers' heartbeats"
    assert client.models.retrieve(tiny_model().name).id == tiny_model().name
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
    response = httpx.get(stack.url + "v1/models")
    assert response.status_code == 401 and response.json()["error"]["type"] == "authentication_error"


def test_whole_and_streamed_answers_equal_the_page_and_follow_ups_hit_the_session_cache(stack, tmp_path):
    picture = make_image(tmp_path / "red.png", (200, 30, 30))
    questions = ["What colour is the shape?", "Where is it?", "How many shapes?"]
    page = page_conversation(stack, picture, questions)

    client, model = openai_client(stack), served_model(stack)
    image = {"type": "image_url", "image_url": {"url": data_url(picture.read_bytes())}}
    messages = [{"role": "user", "content": [{"type": "text", "text": questions[0]}, image]}]
    first = client.chat.completions.create(model=model, messages=messages, max_tokens=ANSWER_TOKENS)
    assert first.choices[0].message.content == page[0], "the API answers what the page answers (fp32)"
    assert first.object == "chat.completion" and first.id.startswith("chatcmpl-")
    assert first.choices[0].finish_reason in ("stop", "length")
    assert first.usage.completion_tokens >= 1 and first.usage.prompt_tokens > 0
    assert first.to_dict()["owlet"]["session_cache_hit"] is False

    hits = []
    for turn, question in enumerate(questions[1:], start=1):
        messages += [{"role": "assistant", "content": page[turn - 1]}, {"role": "user", "content": question}]
        if turn == 1:  # streamed, with the usage chunk
            chunks = list(client.chat.completions.create(model=model, messages=messages, max_tokens=ANSWER_TOKENS,
                                                         stream=True, stream_options={"include_usage": True}))
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            usage_chunk = chunks[-1]
            assert usage_chunk.choices == [] and usage_chunk.usage.completion_tokens >= 1
            assert chunks[0].choices[0].delta.role == "assistant"
            assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")
            usage, owlet = usage_chunk.usage, usage_chunk.to_dict()["owlet"]
        else:
            answer = client.chat.completions.create(model=model, messages=messages, max_tokens=ANSWER_TOKENS)
            text, usage, owlet = answer.choices[0].message.content, answer.usage, answer.to_dict()["owlet"]
        assert text == page[turn], f"turn {turn + 1}: the API answers what the page answers"
        hits.append((owlet["session_cache_hit"], owlet.get("cache_source"), usage.prompt_tokens_details.cached_tokens,
                     usage.prompt_tokens))
    for hit, source, cached, prompt in hits:
        assert hit and source == "session" and 0 < cached < prompt, hits


def test_a_client_that_leaves_mid_stream_cancels_its_job(stack):
    key, model = new_key(stack.url), served_model(stack)
    body = {"model": model, "stream": True, "max_tokens": 1500,
            "messages": [{"role": "user", "content": "Describe everything in great detail."}]}
    with httpx.Client(timeout=120) as http:
        with http.stream("POST", stack.url + "v1/chat/completions", json=body,
                         headers={"Authorization": f"Bearer {key}"}) as response:
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
            job = None
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[len("data: "):])
                job = chunk["id"].removeprefix("chatcmpl-")
                if chunk["choices"][0]["delta"].get("content"):
                    break  # a token arrived: the answer is running
        left_at = time.monotonic()
    assert job
    state_key = stack.prefix + f"job:{job}"
    deadline = time.monotonic() + 10
    with stack_redis(stack) as r:
        while r.hget(state_key, "state") != b"cancelled":
            assert time.monotonic() < deadline, f"the job is still {r.hget(state_key, 'state')}"
            time.sleep(0.05)
    cancelled_after = time.monotonic() - left_at
    while engine_running(metrics(stack)) > 0:
        assert time.monotonic() < deadline, "the cancelled request still holds an engine row"
        time.sleep(0.1)
    assert cancelled_after < 5, cancelled_after


def metrics(stack) -> str:
    return httpx.get(stack.url + "metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}).text


def test_the_raw_stream_is_openai_server_sent_events(stack):
    key, model = new_key(stack.url), served_model(stack)
    body = {"model": model, "stream": True, "max_tokens": 8, "stop": ["\n\n\n\n"],
            "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello?"}]}
    response = httpx.post(stack.url + "v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"},
                          timeout=120)
    assert response.status_code == 200
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1] if e.startswith("data: ")]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert not any("usage" in c for c in chunks), "no usage chunk unless asked"


def test_a_repetition_penalty_reaches_the_engine(stack):
    """vLLM's extension: the worker's engine applies it (the tiny model repeats itself, so a strong one changes its
    answer); out of range, it is refused before anything is queued."""
    client, model = openai_client(stack), served_model(stack)
    messages = [{"role": "user", "content": "Tell me a story about owls, please."}]
    plain = client.chat.completions.create(model=model, messages=messages, max_tokens=24)
    penalised = client.chat.completions.create(model=model, messages=messages, max_tokens=24,
                                               extra_body={"repetition_penalty": 5.0})
    assert penalised.choices[0].message.content != plain.choices[0].message.content, plain.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="repetition_penalty must be a number above 0"):
        client.chat.completions.create(model=model, messages=messages, max_tokens=4,
                                       extra_body={"repetition_penalty": 0})
