"""Bad input is refused with a clear ValueError; failures inside a step fail only the requests involved."""
import io
import time

import numpy as np
import pytest

from engine import FinishReason, SamplingParams, greedy

from .helpers import chat, image, reference_tokens, run_until_done


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty"),
    (chat("   "), "empty"),
    ([{"role": "user", "content": [{"type": "image", "image": b"not an image at all"}]}], "could not be decoded"),
    ([{"role": "user", "content": [{"type": "image", "image": 42}]}], "PIL image"),
    ([{"role": "wizard", "content": "hi"}], "role"),
    ([{"role": "user", "content": [{"type": "video"}]}], "type"),
    ([{"role": "assistant", "content": "hi"}], "last message"),
])
def test_bad_chats_raise_value_error(make_engine, messages, match):
    eng = make_engine("lfm2vl")
    with pytest.raises(ValueError, match=match):
        eng.add_request(messages)
    h = eng.add_request(chat("still serving?"), greedy(3))
    run_until_done(eng)
    assert len(h.result(0).token_ids) == 3


def test_prompt_longer_than_context_is_refused(make_engine):
    eng = make_engine("llava", max_model_len=64)
    with pytest.raises(ValueError, match="this question is too long for the model.*Ask a shorter question"):
        eng.add_request(chat("word " * 200))
    # A short question at the end of a long conversation: a new conversation is what helps.
    history = [{"role": "user", "content": "word " * 30}, {"role": "assistant", "content": "word " * 30},
               {"role": "user", "content": "and?"}]
    with pytest.raises(ValueError, match="the conversation is too long.*Start a new conversation"):
        eng.add_request(history)
    # A long system prompt (an API client's): a new conversation would bring it again.
    with pytest.raises(ValueError, match="the system prompt is too long.*Shorten the system prompt"):
        eng.add_request([{"role": "system", "content": "rule " * 60}, {"role": "user", "content": "hi"}])


def test_generation_stops_at_the_context_limit(make_engine):
    eng = make_engine("llava", max_model_len=40)
    h = eng.add_request(chat("hi"), greedy(500))
    run_until_done(eng)
    r = h.result(0)
    assert r.finish_reason in (FinishReason.LENGTH, FinishReason.EOS)
    assert r.stats.prompt_tokens + len(r.token_ids) <= 40


def test_invalid_sampling_and_deadline_are_refused(make_engine):
    eng = make_engine("lfm2vl")
    with pytest.raises(ValueError):
        eng.add_request(chat("hi"), {"temperature": 2})
    with pytest.raises(ValueError, match="deadline"):
        eng.add_request(chat("hi"), deadline_s=-1)


def test_valid_image_bytes_are_accepted(make_engine):
    buf = io.BytesIO()
    image(1).save(buf, format="PNG")
    eng = make_engine("lfm2vl")
    h = eng.add_request([{"role": "user", "content": [{"type": "image", "image": buf.getvalue()},
                                                      {"type": "text", "text": "colour?"}]}], greedy(2))
    run_until_done(eng)
    assert h.result(0).finish_reason is FinishReason.LENGTH


def test_a_phone_photo_given_as_bytes_is_seen_upright(make_engine):
    """A camera stores a portrait photo sideways, with EXIF orientation 6 ("turn 90 degrees clockwise to show"):
    given as bytes, the engine turns it as every viewer does, so the model sees what its sender sees."""
    from PIL import Image

    sideways = image(5, (96, 64))
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation
    buf = io.BytesIO()
    sideways.save(buf, format="JPEG", exif=exif)
    eng = make_engine("lfm2vl")
    seen = eng.prompts._load_image(buf.getvalue(), 0)
    assert seen.size == (64, 96), "the portrait, upright"
    upright = sideways.transpose(Image.Transpose.ROTATE_270)
    decoded = Image.open(io.BytesIO(buf.getvalue())).convert("RGB").transpose(Image.Transpose.ROTATE_270)
    assert seen.tobytes() == decoded.tobytes() and upright.size == seen.size


def test_a_transparent_picture_is_seen_on_white_as_generate_sees_it(family, make_engine, runners):
    """Transformers' processors flatten transparency onto white (``convert_to_rgb``; LLaVA's does it itself, LFM2-VL's
    takes RGB only); a plain convert("RGB") showed the model a transparent background as black, so its answer differed
    from generate()'s on the picture its processor makes."""
    from PIL import Image, ImageDraw
    from transformers.image_transforms import convert_to_rgb

    logo = Image.new("RGBA", (72, 64), (0, 0, 0, 0))
    ImageDraw.Draw(logo).ellipse([12, 10, 52, 50], fill=(220, 40, 40, 255))
    messages = chat("What is on this picture?", logo)
    eng = make_engine(family)
    h = eng.add_request(messages, greedy(12))
    run_until_done(eng)
    flattened = convert_to_rgb(logo, return_numpy=True)
    assert h.result(0).token_ids == reference_tokens(runners(family), chat("What is on this picture?",
                                                                           Image.fromarray(flattened)), 12)
    assert (np.asarray(eng.prompts._load_image(logo, 0)) == flattened).all()


def test_huge_image_is_downscaled_before_preprocessing(make_engine):
    eng = make_engine("lfm2vl", max_image_pixels=128 * 128)
    h = eng.add_request(chat("what?", image(2, (2000, 1500))), greedy(2))
    run_until_done(eng)
    assert h.result(0).stats.prompt_tokens < 200


def test_prefill_failure_fails_only_that_request(family, make_engine, runners, monkeypatch):
    eng = make_engine(family)
    good = eng.add_request(chat("fine", image(1)), greedy(6))
    eng.step()
    bad = eng.add_request(chat("poisoned"), greedy(6))
    real, real_together = eng.runner.prefill, eng.runner.prefill_together

    def flaky(req, n):
        if req.request_id == bad.request_id:
            raise RuntimeError("injected")
        return real(req, n)

    def flaky_together(reqs, n_tokens):  # a batched prefill holding the bad request fails as a whole
        if any(req.request_id == bad.request_id for req in reqs):
            raise RuntimeError("injected")
        return real_together(reqs, n_tokens)
    monkeypatch.setattr(eng.runner, "prefill", flaky)
    monkeypatch.setattr(eng.runner, "prefill_together", flaky_together)
    run_until_done(eng)
    assert bad.result(0).finish_reason is FinishReason.ERROR and "failed" in bad.result(0).error
    assert good.result(0).token_ids == reference_tokens(runners(family), chat("fine", image(1)), 6)
    monkeypatch.setattr(eng.runner, "prefill", real)
    monkeypatch.setattr(eng.runner, "prefill_together", real_together)
    after = eng.add_request(chat("after"), greedy(4))
    run_until_done(eng)
    assert after.result(0).token_ids == reference_tokens(runners(family), chat("after"), 4)


def test_decode_failure_fails_the_batch_and_the_loop_survives(make_engine, monkeypatch):
    eng = make_engine("lfm2vl").start()
    real = eng.runner.decode
    calls = {"n": 0}

    def flaky(batch):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected decode failure")
        return real(batch)
    monkeypatch.setattr(eng.runner, "decode", flaky)
    victims = [eng.add_request(chat(f"q{i}"), greedy(20, ignore_eos=True)) for i in range(2)]
    results = [v.result(timeout=30) for v in victims]
    assert any(r.finish_reason is FinishReason.ERROR for r in results)
    assert all(r.error for r in results if r.finish_reason is FinishReason.ERROR)
    later = eng.add_request(chat("later"), greedy(3))
    assert later.result(timeout=30).finish_reason is FinishReason.LENGTH


def test_deadline_ends_the_request(make_engine):
    eng = make_engine("lfm2vl").start()
    h = eng.add_request(chat("long answer"), greedy(100_000, ignore_eos=True), deadline_s=0.3)
    r = h.result(timeout=30)
    assert r.finish_reason is FinishReason.DEADLINE and "deadline" in r.error


def test_stop_cancels_in_flight_requests_so_nobody_waits_forever(make_engine):
    eng = make_engine("lfm2vl").start()
    h = eng.add_request(chat("go on"), greedy(100_000, ignore_eos=True))
    time.sleep(0.2)
    eng.stop()
    assert h.result(timeout=5).finish_reason is FinishReason.CANCELLED


def test_waiting_queue_cap(make_engine):
    eng = make_engine("lfm2vl", max_waiting=2, max_running=1)  # max_waiting must hold max_active - max_running
    eng.add_request(chat("a"), greedy(2))
    eng.add_request(chat("b"), greedy(2))
    with pytest.raises(ValueError, match="capacity"):
        eng.add_request(chat("c"), greedy(2))


def test_unexpected_step_error_fails_in_flight_requests_and_the_loop_survives(make_engine, monkeypatch):
    """An error outside the per-request guards (here: sampling) must not kill the loop or hang any stream."""
    import engine.llm_engine as llm_engine

    eng = make_engine("lfm2vl").start()
    real = llm_engine.sample_next_tokens
    calls = {"n": 0}

    def flaky(logits, params, generators, seen=None):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("injected sampler failure")
        return real(logits, params, generators, seen)
    monkeypatch.setattr(llm_engine, "sample_next_tokens", flaky)
    victim = eng.add_request(chat("victim"), greedy(20, ignore_eos=True))
    r = victim.result(timeout=30)
    assert r.finish_reason is FinishReason.ERROR and "internal error" in r.error
    later = eng.add_request(chat("later"), greedy(3))
    assert later.result(timeout=30).finish_reason is FinishReason.LENGTH


def test_a_conversation_the_chat_template_refuses_is_a_value_error_naming_why(tmp_path):
    """Real templates (Gemma 3's, Mistral's) raise for roles that do not alternate; the tiny ones are lenient, so one
    is given Gemma 3's check. The refusal is the template's own sentence, as a ValueError (the user's to fix), not a
    jinja2 error the worker would call a failure of the model."""
    import shutil

    from engine import EngineConfig, LLMEngine
    from training.tiny_checkpoint import ensure_tiny_checkpoint

    folder = tmp_path / "strict"
    shutil.copytree(ensure_tiny_checkpoint("gemma3"), folder)
    template = folder / "chat_template.jinja"
    template.write_text("{%- for m in messages %}{%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) %}"
                        "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
                        "{%- endif %}{%- endfor %}" + template.read_text())
    engine = LLMEngine(EngineConfig(model=str(folder), dtype="float32", cpu_kernels="off"))
    try:
        with pytest.raises(ValueError, match="chat template does not take this conversation: Conversation roles "
                                             "must alternate"):
            engine.add_request(chat("hi") + chat("again"), greedy(2))
        assert engine.add_request(chat("hi"), greedy(2)).request_id  # one that alternates is taken
    finally:
        engine.stop()
