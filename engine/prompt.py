"""Turn a chat (messages with text and images) into prompt token ids plus per-image pixel inputs.

The chat template renders the text with one placeholder per image. Each image is preprocessed on its own (and
remembered by content hash), which gives both its pixel tensors and the exact text the processor expands its
placeholder into. The expanded prompt is then tokenised once, as
``processor.apply_chat_template(..., tokenize=True)`` does: special tokens (a BOS) are added only when the
template did not write BOS itself, and never inside an image's expansion. Tests check the ids equal the
processor's for every family, while an image seen in an earlier turn is never preprocessed again.

Bad input raises ValueError with a message a user can act on.
"""
from __future__ import annotations

import hashlib
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

from jinja2.exceptions import TemplateError
from PIL import Image, ImageOps

ROLES = ("system", "user", "assistant")


@dataclass
class PromptImage:
    sha256: str
    pixel_inputs: dict  # processor tensors for this image alone (pixel_values, ...)
    token_ids: list[int]  # the run its placeholder expands to (image tokens plus any markers)
    text: str  # the same run as text, spliced into the prompt before tokenising
    num_image_tokens: int  # how many of those are image-feature slots


@dataclass
class Prompt:
    token_ids: list[int]
    images: list[PromptImage] = field(default_factory=list)
    head_ids: list[int] = field(default_factory=list)  # template head shared by every chat (see _head_ids)


def _to_rgb(image: Image.Image) -> Image.Image:
    """RGB as transformers' processors make it (``image_transforms.convert_to_rgb``): transparency composited onto
    white, as a viewer shows it on a page, not dropped (a plain convert shows a transparent background as black)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        return Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba).convert("RGB")
    return image.convert("RGB")


class PromptBuilder:
    def __init__(self, processor, image_token_id: int, *, max_image_pixels: int, max_images: int,
                 cache_entries: int = 64, placeholder: str | None = None):
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.image_token_id = image_token_id
        # What the chat template writes per image: usually the image token, but e.g. Gemma 3 writes
        # <start_of_image> and its processor expands that (engine/models/families.py names it per family).
        self.image_token = placeholder or self.tokenizer.convert_ids_to_tokens(image_token_id)
        self.max_image_pixels = max_image_pixels
        self.max_images = max_images
        self._images: OrderedDict[str, PromptImage] = OrderedDict()
        self._cache_entries = cache_entries
        self._lock = threading.Lock()  # add_request runs on many caller threads

    def build(self, messages) -> Prompt:
        chat, images = self._normalise(messages)
        text = self._render(chat, add_generation_prompt=True)
        pieces = text.split(self.image_token)
        if len(pieces) - 1 != len(images):
            raise ValueError("the chat template did not place one image placeholder per image")
        prompt_images = [self._prepare_image(img) for img in images]
        expanded = pieces[0] + "".join(img.text + piece for img, piece in zip(prompt_images, pieces[1:]))
        ids = self.tokenizer(expanded, add_special_tokens=self._adds_special(text))["input_ids"]
        if ids.count(self.image_token_id) != sum(img.num_image_tokens for img in prompt_images):
            raise ValueError("the prompt's image tokens do not match its images; the chat template or processor "
                             "of this checkpoint is not supported")
        return Prompt(token_ids=ids, images=prompt_images, head_ids=self._head_ids(chat, ids))

    def question_tokens(self, messages) -> int:
        """How many tokens the last user message's text alone takes (no template, no image): to tell a question
        too long for the model from a conversation grown too long."""
        last = messages[-1].get("content") if messages and isinstance(messages[-1], dict) else None
        items = [{"type": "text", "text": last}] if isinstance(last, str) else last or []
        text = " ".join(i["text"] for i in items if isinstance(i, dict) and isinstance(i.get("text"), str))
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _render(self, chat, add_generation_prompt: bool = False) -> str:
        """The chat template's text for ``chat``. A template that refuses a conversation (real ones raise for roles
        that do not alternate, or a system message the model has no place for) says why in a ValueError."""
        try:
            return self.processor.apply_chat_template(chat, tokenize=False, add_generation_prompt=add_generation_prompt)
        except TemplateError as exc:
            raise ValueError(f"this model's chat template does not take this conversation: {exc}") from None

    def _adds_special(self, text: str) -> bool:
        """As the processor's apply_chat_template: the tokenizer's own BOS only if the template wrote none."""
        bos = self.tokenizer.bos_token
        return not (bos is not None and text.startswith(bos))

    def _head_ids(self, chat, ids: list[int]) -> list[int]:
        """Tokens before the first user's content: BOS, any system prompt, and the user turn header.

        Found by rendering the chat up to its first user message twice, with different contents, and keeping
        the common start. Empty when that start holds an image or does not tokenise to a prefix of ``ids``.
        """
        first_user = next(i for i, m in enumerate(chat) if m["role"] == "user")
        if any(item["type"] == "image" for m in chat[:first_user] for item in m["content"]):
            return []
        render = lambda text: self._render(  # noqa: E731
            chat[:first_user] + [{"role": "user", "content": [{"type": "text", "text": text}]}])
        a, b = render("A"), render("B")
        n = 0
        while n < min(len(a), len(b)) and a[n] == b[n]:
            n += 1
        head = self.tokenizer(a[:n], add_special_tokens=self._adds_special(a))["input_ids"] if n else []
        return head if head and ids[:len(head)] == head and len(head) < len(ids) else []

    # -- validation -----------------------------------------------------------
    def _normalise(self, messages):
        if not isinstance(messages, (list, tuple)) or not messages:
            raise ValueError("messages must be a non-empty list of chat messages")
        chat, images = [], []
        for n, msg in enumerate(messages):
            if not isinstance(msg, dict) or msg.get("role") not in ROLES:
                raise ValueError(f"message {n} must be a dict with role in {ROLES}")
            content = msg.get("content")
            if isinstance(content, str):
                content = [{"type": "text", "text": content}]
            if not isinstance(content, (list, tuple)):
                raise ValueError(f"message {n}: content must be a string or a list of items")
            items = []
            for item in content:
                kind = item.get("type") if isinstance(item, dict) else None
                if kind == "text":
                    if not isinstance(item.get("text"), str):
                        raise ValueError(f"message {n}: text items need a string 'text'")
                    items.append({"type": "text", "text": item["text"]})
                elif kind == "image":
                    images.append(self._load_image(item.get("image"), n))
                    items.append({"type": "image"})
                else:
                    raise ValueError(f"message {n}: content items must have type 'text' or 'image'")
            chat.append({"role": msg["role"], "content": items})
        if len(images) > self.max_images:
            raise ValueError(f"too many images: {len(images)} (at most {self.max_images} per conversation)")
        last = chat[-1]
        if last["role"] != "user":
            raise ValueError("the last message must come from the user")
        if not any(i["type"] == "image" or i["text"].strip() for i in last["content"]):
            raise ValueError("the prompt is empty: ask a question or attach an image")
        return chat, images

    def _load_image(self, image, n: int) -> Image.Image:
        if isinstance(image, (bytes, bytearray)):
            try:
                image = Image.open(io.BytesIO(image))
                image.load()
                # A phone's photo is stored as the sensor saw it, with the turn to show it upright in its EXIF tags:
                # every viewer applies it, so the model must see the picture the way its sender does.
                image = ImageOps.exif_transpose(image)
            except Exception as exc:  # PIL raises many types for corrupt data
                raise ValueError(f"message {n}: the image could not be decoded ({type(exc).__name__})") from None
        if not isinstance(image, Image.Image):
            raise ValueError(f"message {n}: image must be a PIL image or encoded image bytes")
        if image.width < 1 or image.height < 1:
            raise ValueError(f"message {n}: the image is empty")
        if image.mode != "RGB":
            image = _to_rgb(image)
        if image.width * image.height > self.max_image_pixels:
            # Bound the work before preprocessing: big images tile into thousands of tokens.
            scale = (self.max_image_pixels / (image.width * image.height)) ** 0.5
            image = image.resize((max(1, int(image.width * scale)), max(1, int(image.height * scale))),
                                 Image.BICUBIC)
        return image

    # -- per-image preprocessing, remembered by content ------------------------
    def _prepare_image(self, image: Image.Image) -> PromptImage:
        digest = hashlib.sha256(f"{image.size}".encode() + image.tobytes()).hexdigest()
        with self._lock:
            hit = self._images.get(digest)
            if hit is not None:
                self._images.move_to_end(digest)
                return hit
        # No special tokens: a BOS-adding tokenizer would otherwise put a stray BOS before every image.
        out = self.processor(images=[image], text=self.image_token, return_tensors="pt", add_special_tokens=False)
        token_ids = out["input_ids"][0].tolist()
        pixel_inputs = {k: v for k, v in out.items()
                        if k not in ("input_ids", "attention_mask", "mm_token_type_ids", "token_type_ids")}
        text = self.tokenizer.decode(token_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        prepared = PromptImage(digest, pixel_inputs, token_ids, text, token_ids.count(self.image_token_id))
        with self._lock:
            self._images[digest] = prepared
            while len(self._images) > self._cache_entries:
                self._images.popitem(last=False)
        return prepared
