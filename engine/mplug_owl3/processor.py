"""mPLUG-Owl3's processor, as the engine's PromptBuilder needs it: chat rendering, image preprocessing, and the
``<|image|>`` expansion.

Published behaviour this follows (``processing_mplugowl3.py``, ``image_processing_mplugowl3.py``):
- the chat is Qwen ChatML with mPLUG-Owl3's own spacing: ``<|im_start|>system\\n<|im_end|>`` first (empty system
  turn unless one is given), then ``\\n<|im_start|>user\\n...<|im_end|>`` per user turn and
  ``\\n<|im_start|>assistant\\n...<|im_end|><|endoftext|>`` per answer, and ``\\n<|im_start|>assistant\\n`` to ask
  for the next one;
- each image is one ``<|image|>`` token; the model reads which images a token may see from the image tokens'
  positions ("media offsets": a token sees image j when it comes after image j's token), and the image's keys are
  rotated to the position right after its token (see model.py);
- images are resized to ``image_size`` squared (378 for the 2B model, bicubic) and normalised with mean = std = 0.5.

Not implemented: the published processor can also cut a large image into a grid of 378-pixel crops, each with its
own ``<|image|>`` token plus a layout prompt (``cut_enable``). Owlet always resizes (``cut_enable=False``), which
the published processor also supports (it is what it does for video frames).
"""
from __future__ import annotations

import torch
from PIL import Image

IMAGE_TOKEN = "<|image|>"
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
TERMINATORS = (IM_END, END_OF_TEXT)


def render_chat(chat: list[dict], add_generation_prompt: bool) -> str:
    """``chat`` holds messages whose content is a list of {"type": "text"|"image"} items (PromptBuilder's form)."""
    parts = []
    for i, msg in enumerate(chat):
        content = "".join(IMAGE_TOKEN if item["type"] == "image" else item["text"] for item in msg["content"])
        if i == 0 and msg["role"] != "system":
            parts.append(f"{IM_START}system\n{IM_END}")
        if msg["role"] == "system":
            parts.append(f"{IM_START}system\n{content}{IM_END}")
        elif msg["role"] == "user":
            parts.append(f"\n{IM_START}user\n{content}{IM_END}")
        else:
            parts.append(f"\n{IM_START}assistant\n{content}{IM_END}{END_OF_TEXT}")
    if add_generation_prompt:
        parts.append(f"\n{IM_START}assistant\n")
    return "".join(parts)


def preprocess_image(image: Image.Image, size: int) -> torch.Tensor:
    """[3, size, size] float tensor in [-1, 1]."""
    img = image.convert("RGB").resize((size, size), Image.BICUBIC)
    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(size, size, 3)
    return (pixels.permute(2, 0, 1).float() / 255.0 - 0.5) / 0.5


class OwlProcessor:
    """The processor interface engine.prompt.PromptBuilder calls: ``apply_chat_template``, ``__call__`` for one
    image placeholder, and ``.tokenizer``."""

    def __init__(self, tokenizer, image_size: int):
        self.tokenizer = tokenizer
        self.image_size = image_size
        ids = tokenizer(IMAGE_TOKEN, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"the tokenizer splits {IMAGE_TOKEN} into {len(ids)} tokens; Owlet's mPLUG-Owl3 path "
                             f"needs it to be one token (add it as a special token in tokenizer_config.json)")
        self.image_token_id = ids[0]

    def apply_chat_template(self, chat, tokenize: bool = False, add_generation_prompt: bool = False, **_):
        text = render_chat(chat, add_generation_prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def __call__(self, images=None, text: str = IMAGE_TOKEN, return_tensors: str = "pt", **_):
        out = {"input_ids": torch.tensor([self.tokenizer(text, add_special_tokens=False)["input_ids"]])}
        if images:
            out["pixel_values"] = torch.stack([preprocess_image(im, self.image_size) for im in images])
        return out

    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.convert_tokens_to_ids(t) for t in TERMINATORS}
        return {i for i in ids if i is not None and i != self.tokenizer.unk_token_id}
