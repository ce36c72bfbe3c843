"""Shared helpers for engine tests: synthetic images and chats, and the per-request generate() reference."""
from __future__ import annotations

import torch
from PIL import Image, ImageDraw

from engine.models.reference_run import reference_run


def image(seed: int, size=(64, 64)) -> Image.Image:
    """A deterministic picture: a coloured background with a shape, different per seed."""
    g = torch.Generator().manual_seed(seed)
    c = [int(x) for x in torch.randint(0, 255, (6,), generator=g)]
    img = Image.new("RGB", size, tuple(c[:3]))
    d = ImageDraw.Draw(img)
    w, h = size
    d.ellipse([w // 5, h // 5, w // 5 + w // 2, h // 5 + h // 2], fill=tuple(c[3:]))
    return img


def chat(text: str, img: Image.Image | None = None) -> list[dict]:
    content = ([{"type": "image", "image": img}] if img is not None else []) + [{"type": "text", "text": text}]
    return [{"role": "user", "content": content}]


def reference_tokens(runner, messages, max_new_tokens: int, **generate_kwargs) -> list[int]:
    """Greedy tokens from HF generate() on this request alone: the ground truth every engine path must match.
    ``generate_kwargs`` override the checkpoint's generation config (``repetition_penalty=1.0``)."""
    proc, model = runner.processor, runner.model
    images = [i["image"] for m in messages if isinstance(m["content"], list) for i in m["content"]
              if i["type"] == "image"]
    text = proc.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = proc(images=images or None, text=text, return_tensors="pt").to(model.device)
    with torch.inference_mode(), reference_run():  # the model's own code, not the engine's CPU kernels
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, **generate_kwargs)
    return out[0, inputs["input_ids"].shape[1]:].tolist()


def run_until_done(engine, max_steps: int = 10_000) -> None:
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
        assert steps < max_steps, "engine did not drain"


def serve_staggered(engine, requests, steps_after=lambda i: i % 3 + 1) -> list:
    """Submit ``(messages, max_new_tokens)`` requests greedily one by one, with ``steps_after(i)`` engine steps
    after request i (so arrivals land while earlier requests are mid-decode), run to the end; the handles."""
    from engine import greedy

    handles = []
    for i, (messages, n) in enumerate(requests):
        handles.append(engine.add_request(messages, greedy(n)))
        for _ in range(steps_after(i)):
            engine.step()
    run_until_done(engine)
    return handles
