"""mPLUG-Owl3's processor, as the engine's PromptBuilder needs it: chat rendering, image preprocessing, and the
``<|image|>`` expansion.

Published behaviour this follows (``processing_mplugowl3.py``, ``image_processing_mplugowl3.py``):
- the chat is Qwen ChatML with mPLUG-Owl3's own spacing: ``<|im_start|>system\\n<|im_end|>`` first (empty system
  turn unless one is given), then ``\\n<|im_start|>user\\n...<|im_end|>`` per user turn and
  ``\\n<|im_start|>assistant\\n...<|im_end|><|endoftext|>`` per answer, and ``\\n<|im_start|>assistant\\n`` to ask
  for the next one;
- each image is cut into a grid of ``image_size`` crops plus a global view (the published default: grids
  ``grid_squ_6``, "docowl" anchor choice, prompt ``v2`` with a global view), and its ``<|image|>`` placeholder
  becomes ``Cut to R rows C columns with a global view\nsubimg(0,0)<|image|> subimg(0,1)<|image|>...\n
  global_view<|image|>``: one ``<|image|>`` token per crop. For the model every crop is an image of its own: a
  token sees crop j when it comes after crop j's token ("media offsets"), and the crop's keys are rotated to the
  position right after its token (see model.py);
- crops are ``image_size`` squares (bicubic; config.json's vision side, else the layout's: 384 px in the 240728
  code) normalised with mean = std = 0.5. With ``cut_images=False`` an image is one resized crop and one
  ``<|image|>`` (what the published processor does for video frames).

Known differences from the published processor: it splits the user text at each ``<|image|>`` and tokenises
"text before the image + cut prompt" as one piece, while Owlet tokenises the image's run on its own; the two agree
unless the text right before an image ends in a space or punctuation that BPE would join to "Cut". With several
images in one request the published 241014 processor pairs the second image with the first one's global-view
shape (its crops and tokens then disagree); Owlet cuts every image the same way.
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


# (rows, columns) grids a picture may be cut into: the published processor's "grid_squ_6".
GRIDS = ((2, 2), (1, 3), (1, 4), (3, 1), (4, 1), (2, 3), (3, 2))


def _origin_iou(w1: float, h1: float, w2: float, h2: float) -> float:
    """IoU of two boxes that share the origin corner (the published code adds 1e-5 to the union)."""
    inter = min(w1, w2) * min(h1, h2)
    return inter / (w1 * h1 + w2 * h2 - inter + 1e-5)


def choose_grid(width: int, height: int, size: int) -> tuple[int, int]:
    """The grid whose shape best matches the picture's, then whose resolution does ("docowl" strategy)."""
    best, best_score = GRIDS[0], float("-inf")
    for rows, cols in GRIDS:
        aw, ah = cols * size, rows * size
        # The anchor's width with the picture's aspect ratio; integer, as the published int64 boxes hold it.
        shape_h = int(height / width * aw)
        score = _origin_iou(aw, ah, aw, shape_h) * 100 + _origin_iou(aw, ah, width, height)
        if score > best_score:  # the first maximum wins, like argmax
            best, best_score = (rows, cols), score
    return best


def cut_prompt(rows: int, cols: int) -> str:
    lines = [" ".join(f"subimg({i},{j}){IMAGE_TOKEN}" for j in range(cols)) for i in range(rows)]
    return f"Cut to {rows} rows {cols} columns with a global view\n" + "\n".join(lines) + f"\nglobal_view{IMAGE_TOKEN}"


def _to_tensor(img: Image.Image) -> torch.Tensor:
    w, h = img.size
    pixels = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(h, w, 3)
    return (pixels.permute(2, 0, 1).float() / 255.0 - 0.5) / 0.5


def preprocess_image(image: Image.Image, size: int) -> torch.Tensor:
    """One resized crop [3, size, size] in [-1, 1]."""
    return _to_tensor(image.convert("RGB").resize((size, size), Image.BICUBIC))


def cut_image(image: Image.Image, size: int) -> tuple[torch.Tensor, int, int]:
    """Crops [rows * cols + 1, 3, size, size] (row-major, then the global view) and the grid."""
    image = image.convert("RGB")
    rows, cols = choose_grid(image.width, image.height, size)
    grid = _to_tensor(image.resize((cols * size, rows * size), Image.BICUBIC))
    crops = grid.view(3, rows, size, cols, size).permute(1, 3, 0, 2, 4).reshape(rows * cols, 3, size, size)
    return torch.cat([crops, preprocess_image(image, size)[None]]), rows, cols


class OwlProcessor:
    """The processor interface engine.prompt.PromptBuilder calls: ``apply_chat_template``, ``__call__`` for one
    image placeholder, and ``.tokenizer``."""

    def __init__(self, tokenizer, image_size: int, cut_images: bool = True):
        self.tokenizer = tokenizer
        self.image_size = image_size
        self.cut_images = cut_images
        ids = tokenizer(IMAGE_TOKEN, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ValueError(f"the tokenizer splits {IMAGE_TOKEN} into {len(ids)} tokens; Owlet's mPLUG-Owl3 path "
                             f"needs it to be one token (add it as a special token in tokenizer_config.json)")
        self.image_token_id = ids[0]

    def apply_chat_template(self, chat, tokenize: bool = False, add_generation_prompt: bool = False, **_):
        text = render_chat(chat, add_generation_prompt)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"] if tokenize else text

    def __call__(self, images=None, text: str = IMAGE_TOKEN, return_tensors: str = "pt", **_):
        """Expand each ``<|image|>`` of ``text`` for the matching image; pixel_values hold every crop in order."""
        pieces, crops = text.split(IMAGE_TOKEN), []
        images = list(images or [])
        if len(pieces) - 1 != len(images):
            raise ValueError(f"{len(pieces) - 1} {IMAGE_TOKEN} placeholders for {len(images)} images")
        expanded = pieces[0]
        for image, piece in zip(images, pieces[1:]):
            if self.cut_images:
                pixels, rows, cols = cut_image(image, self.image_size)
                expanded += cut_prompt(rows, cols) + piece
            else:
                pixels = preprocess_image(image, self.image_size)[None]
                expanded += IMAGE_TOKEN + piece
            crops.append(pixels)
        out = {"input_ids": torch.tensor([self.tokenizer(expanded, add_special_tokens=False)["input_ids"]])}
        if crops:
            out["pixel_values"] = torch.cat(crops)
        return out

    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.convert_tokens_to_ids(t) for t in TERMINATORS}
        return {i for i in ids if i is not None and i != self.tokenizer.unk_token_id}
