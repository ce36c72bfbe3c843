"""Tiny offline checkpoints of the VLM families people bring: Qwen2/2.5/3-VL, Gemma 3, Idefics3, InternVL, Mistral 3.

Each builder writes a random-init model with the family's real processor class, a tokenizer trained locally
with the family's special tokens, and a chat template shaped like the real one (same markers, same BOS
handling), so the engine meets the same prompt layout a downloaded checkpoint gives it. Gemma 3 and Mistral 3
use tokenizers that add BOS by themselves, as the real ones do.

``training.tiny_checkpoint.ensure_tiny_checkpoint(family)`` builds and caches these like the LFM2-VL and LLaVA
ones. Sizes are a few hundred KB: enough for exactness tests, not for answers.
"""
from __future__ import annotations

from pathlib import Path

_CORPUS = [
    "What colour is the circle? The circle is red.",
    "How many squares are there? There are two squares.",
    "Where is the triangle? It is on the left, near the top.",
    "Describe the image. A small blue star and a large green square on a striped background.",
    "Is there a red square? Yes. No. Which shape is largest? The circle. Tell me a story about owls.",
    "The quick brown fox jumps over the lazy dog 0123456789. user assistant system model",
]


def family_tokenizer(special: list[str], *, bos: str | None, eos: str, pad: str, add_bos: bool,
                     chat_template: str, vocab_size: int = 400, extra: dict | None = None):
    """A byte-level BPE with ``special`` tokens; ``add_bos`` makes plain tokenisation prepend BOS (Llama/Gemma)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_CORPUS * 4, trainer=trainer)
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tok.token_to_id(bos))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad,
                                   extra_special_tokens=extra or {})
    fast.chat_template = chat_template
    return fast


def _text(tokenizer, **overrides) -> dict:
    text = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                initializer_range=0.3,  # a wide init gives varied, image-dependent greedy output
                pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    text.update(overrides)
    return text


def _finish(out_dir, model_cls, config, processor, tokenizer, seed: int) -> Path:
    import torch

    from .tiny_checkpoint import _save, _set_generation_ids

    torch.manual_seed(seed)
    model = model_cls(config).float()
    _widen_init(model)
    _set_generation_ids(model, tokenizer)
    return _save(out_dir, model, processor)


def _widen_init(model, std: float = 0.3) -> None:
    """Some families init from fixed small constants whatever initializer_range says; a random model then
    repeats one token. Re-draw embeddings and the LM head so greedy output varies with the input."""
    import torch

    with torch.no_grad():
        model.get_input_embeddings().weight.normal_(0, std)
        head = model.get_output_embeddings()
        if head is not None and head.weight is not model.get_input_embeddings().weight:
            head.weight.normal_(0, std)
        # Gemma 3 starts its image projection at zero: every image would look the same to the model.
        for name, param in model.named_parameters():
            if "multi_modal_projector" in name and param.dim() >= 2 and not param.any():
                param.normal_(0, 0.3)
        # Qwen3-VL DeepStack mergers: at the default init their features barely move the logits, and a test
        # that forgot them would still pass.
        for merger in getattr(getattr(model.model, "visual", None), "deepstack_merger_list", ()):
            for linear in (m for m in merger.modules() if isinstance(m, torch.nn.Linear)):
                linear.weight.normal_(0, 0.5)


# -- Qwen2-VL / Qwen2.5-VL / Qwen3-VL ---------------------------------------------------------------
QWEN_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
               "<|image_pad|>", "<|video_pad|>"]
# The Qwen2-VL template, shortened: a default system turn, ChatML turns, images as vision_start/pad/end.
QWEN_TEMPLATE = (
    "{%- if messages[0]['role'] != 'system' -%}{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<|vision_start|><|image_pad|><|vision_end|>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def _qwen_tokenizer():
    return family_tokenizer(QWEN_TOKENS, bos=None, eos="<|im_end|>", pad="<|endoftext|>", add_bos=False,
                            chat_template=QWEN_TEMPLATE)


def _qwen_processor(kind: str, tokenizer, patch: int):
    import transformers as tf

    pix = dict(min_pixels=4 * patch * patch * 4, max_pixels=64 * patch * patch * 4)
    if kind == "qwen3vl":
        image = tf.Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                         size={"shortest_edge": pix["min_pixels"], "longest_edge": pix["max_pixels"]},
                                         image_mean=[0.5] * 3, image_std=[0.5] * 3)
        video = tf.Qwen3VLVideoProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2)
        return tf.Qwen3VLProcessor(image_processor=image, tokenizer=tokenizer, video_processor=video,
                                   chat_template=QWEN_TEMPLATE)
    image = tf.Qwen2VLImageProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2,
                                     size={"shortest_edge": pix["min_pixels"], "longest_edge": pix["max_pixels"]})
    video = tf.Qwen2VLVideoProcessor(patch_size=patch, merge_size=2, temporal_patch_size=2)
    cls = tf.Qwen2_5_VLProcessor if kind == "qwen2_5vl" else tf.Qwen2VLProcessor
    return cls(image_processor=image, tokenizer=tokenizer, video_processor=video, chat_template=QWEN_TEMPLATE)


def build_qwen_vl_checkpoint(out_dir, kind: str = "qwen2vl", seed: int = 0) -> Path:
    """Qwen2-VL (``kind="qwen2vl"``), Qwen2.5-VL (``"qwen2_5vl"``) or Qwen3-VL (``"qwen3vl"``, with DeepStack)."""
    import transformers as tf

    patch = 8
    tok = _qwen_tokenizer()
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in
           (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    if kind == "qwen2vl":
        vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=patch,
                      spatial_merge_size=2, temporal_patch_size=2)
        config = tf.Qwen2VLConfig(text_config=_text(tok, rope_parameters=rope), vision_config=vision, **ids)
        model_cls = tf.Qwen2VLForConditionalGeneration
    elif kind == "qwen2_5vl":
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      patch_size=patch, spatial_merge_size=2, temporal_patch_size=2, window_size=32,
                      fullatt_block_indexes=[1])
        config = tf.Qwen2_5_VLConfig(text_config=_text(tok, rope_parameters=rope), vision_config=vision, **ids)
        model_cls = tf.Qwen2_5_VLForConditionalGeneration
    elif kind == "qwen3vl":
        rope["mrope_section"] = [2, 3, 3]
        rope["mrope_interleaved"] = True
        vision = dict(depth=2, hidden_size=32, out_hidden_size=64, intermediate_size=64, num_heads=2,
                      patch_size=patch, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64,
                      deepstack_visual_indexes=[0, 1])
        config = tf.Qwen3VLConfig(text_config=_text(tok, rope_parameters=rope), vision_config=vision, **ids)
        model_cls = tf.Qwen3VLForConditionalGeneration
    else:
        raise ValueError(kind)
    return _finish(out_dir, model_cls, config, _qwen_processor(kind, tok, patch), tok, seed)


# -- Gemma 3 --------------------------------------------------------------------------------------
GEMMA_TOKENS = ["<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
                "<end_of_image>", "<image_soft_token>"]
# Gemma 3's template, shortened: BOS, a system prompt folded into the first user turn, "model" for the
# assistant, and <start_of_image> per image (the processor expands it to \n\n<boi> soft tokens <eoi>\n\n).
GEMMA_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- if messages[0]['role'] == 'system' -%}"
    "{%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}{%- set first_user_prefix = '' -%}{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{- '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '') -}}"
    "{%- if message['content'] is string -%}{{- message['content'] | trim -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<start_of_image>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] | trim -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<end_of_turn>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\n' -}}{%- endif -%}"
)


def build_gemma3_checkpoint(out_dir, *, sliding_window: int = 16, seed: int = 0) -> Path:
    """Gemma 3 with a sliding-window layer (window smaller than the test prompts) and a full-attention one."""
    import transformers as tf

    tok = family_tokenizer(GEMMA_TOKENS, bos="<bos>", eos="<eos>", pad="<pad>", add_bos=True,
                           chat_template=GEMMA_TEMPLATE,
                           extra={"image_token": "<image_soft_token>", "boi_token": "<start_of_image>",
                                  "eoi_token": "<end_of_image>"})
    ids = {name: tok.convert_tokens_to_ids(t) for name, t in
           (("image_token_index", "<image_soft_token>"), ("boi_token_index", "<start_of_image>"),
            ("eoi_token_index", "<end_of_image>"))}
    text = _text(tok, sliding_window=sliding_window, num_hidden_layers=3,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                 query_pre_attn_scalar=16)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=48, patch_size=8)
    config = tf.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=9,
                             tie_word_embeddings=False, **ids)
    image = tf.Gemma3ImageProcessor(size={"height": 48, "width": 48}, do_pan_and_scan=False)
    processor = tf.Gemma3Processor(image_processor=image, tokenizer=tok, image_seq_length=9,
                                   chat_template=GEMMA_TEMPLATE)
    out = _finish(out_dir, tf.Gemma3ForConditionalGeneration, config, processor, tok, seed)
    _set_eos(out, [tok.eos_token_id, tok.convert_tokens_to_ids("<end_of_turn>")])
    return out


# -- Mistral 3 (Pixtral vision) ---------------------------------------------------------------------
MISTRAL_TOKENS = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[IMG]",
                  "[IMG_BREAK]", "[IMG_END]", "<pad>"]
# Mistral Small 3.1's template, shortened: BOS, [INST] ... [/INST] turns, answers closed by </s>, [IMG] per image.
MISTRAL_TEMPLATE = (
    "{{- bos_token -}}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}{{- '[SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[INST]' -}}{%- endif -%}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '[IMG]' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- if message['role'] == 'system' -%}{{- '[/SYSTEM_PROMPT]' -}}"
    "{%- elif message['role'] == 'user' -%}{{- '[/INST]' -}}"
    "{%- else -%}{{- eos_token -}}{%- endif -%}"
    "{%- endfor -%}"
)


def build_mistral3_checkpoint(out_dir, *, sliding_window: int | None = 24, seed: int = 0) -> Path:
    """Mistral 3 (Pixtral vision + Mistral text); ``sliding_window`` smaller than the test prompts by default."""
    import transformers as tf

    tok = family_tokenizer(MISTRAL_TOKENS, bos="<s>", eos="</s>", pad="<pad>", add_bos=True,
                           chat_template=MISTRAL_TEMPLATE)
    patch, merge = 8, 2
    text = _text(tok, sliding_window=sliding_window)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, head_dim=16,
                  image_size=64, patch_size=patch)
    config = tf.Mistral3Config(text_config=tf.MistralConfig(**text).to_dict(), vision_config=vision,
                               image_token_index=tok.convert_tokens_to_ids("[IMG]"), spatial_merge_size=merge,
                               vision_feature_layer=-1, tie_word_embeddings=False)
    image = tf.PixtralImageProcessor(size={"longest_edge": 64}, patch_size=patch * merge)
    processor = tf.PixtralProcessor(image_processor=image, tokenizer=tok, patch_size=patch,
                                    spatial_merge_size=merge, chat_template=MISTRAL_TEMPLATE)
    return _finish(out_dir, tf.Mistral3ForConditionalGeneration, config, processor, tok, seed)


def _set_eos(folder: Path, eos_ids: list[int]) -> None:
    """Several end tokens, as the real Gemma generation config lists (<eos> and <end_of_turn>)."""
    from transformers import GenerationConfig

    gc = GenerationConfig.from_pretrained(folder)
    gc.eos_token_id = eos_ids
    gc.save_pretrained(folder)


# -- Idefics3 / SmolVLM ------------------------------------------------------------------------------
IDEFICS_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<end_of_utterance>", "<fake_token_around_image>",
                  "<image>", "<global-img>", "<|pad|>",
                  *[f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]]
# The Idefics3 template: BOS written by the template, "User:" / "Assistant:" turns closed by <end_of_utterance>.
IDEFICS_TEMPLATE = (
    "<|begin_of_text|>"
    "{%- for message in messages -%}"
    "{{- message['role'] | capitalize -}}"
    "{%- if message['content'][0]['type'] == 'image' -%}{{- ':' -}}{%- else -%}{{- ': ' -}}{%- endif -%}"
    "{%- for line in message['content'] -%}"
    "{%- if line['type'] == 'text' -%}{{- line['text'] -}}"
    "{%- elif line['type'] == 'image' -%}{{- '<image>' -}}{%- endif -%}"
    "{%- endfor -%}"
    "{{- '<end_of_utterance>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Assistant:' -}}{%- endif -%}"
)


def build_idefics3_checkpoint(out_dir, *, smolvlm: bool = False, seed: int = 0) -> Path:
    """Idefics3 (SigLIP + Llama 3, BOS-adding tokenizer) or SmolVLM (the same layout, its own classes)."""
    import transformers as tf

    tok = family_tokenizer(IDEFICS_TOKENS, bos="<|begin_of_text|>", eos="<end_of_utterance>", pad="<|pad|>",
                           add_bos=True, chat_template=IDEFICS_TEMPLATE,
                           extra={"image_token": "<image>", "fake_image_token": "<fake_token_around_image>",
                                  "global_image_token": "<global-img>",
                                  "end_of_utterance_token": "<end_of_utterance>"})
    image_size, patch, scale = 32, 8, 2
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=image_size, patch_size=patch)
    text = _text(tok)
    seq_len = (image_size // patch) ** 2 // scale ** 2
    image_kwargs = dict(size={"longest_edge": image_size}, max_image_size={"longest_edge": image_size},
                        do_image_splitting=False)
    image_id = tok.convert_tokens_to_ids("<image>")
    if smolvlm:
        config = tf.SmolVLMConfig(text_config=text, vision_config=vision, scale_factor=scale,
                                  image_token_id=image_id, tie_word_embeddings=False)
        processor = tf.SmolVLMProcessor(image_processor=tf.SmolVLMImageProcessor(**image_kwargs), tokenizer=tok,
                                        video_processor=tf.SmolVLMVideoProcessor(), image_seq_len=seq_len,
                                        chat_template=IDEFICS_TEMPLATE)
        model_cls = tf.SmolVLMForConditionalGeneration
    else:
        config = tf.Idefics3Config(text_config=text, vision_config=vision, scale_factor=scale,
                                   image_token_id=image_id, tie_word_embeddings=False)
        processor = tf.Idefics3Processor(image_processor=tf.Idefics3ImageProcessor(**image_kwargs), tokenizer=tok,
                                         image_seq_len=seq_len, chat_template=IDEFICS_TEMPLATE)
        model_cls = tf.Idefics3ForConditionalGeneration
    return _finish(out_dir, model_cls, config, processor, tok, seed)


# -- InternVL ---------------------------------------------------------------------------------------
INTERNVL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<img>", "</img>", "<IMG_CONTEXT>", "<video>"]
# InternVL3 (-hf layout): ChatML on a Qwen2 tokenizer, <IMG_CONTEXT> per image (expanded to <img>...</img>).
INTERNVL_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' -%}{{- '<IMG_CONTEXT>\n' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}"
)


def build_internvl_checkpoint(out_dir, *, seed: int = 0) -> Path:
    import transformers as tf

    tok = family_tokenizer(INTERNVL_TOKENS, bos=None, eos="<|im_end|>", pad="<|endoftext|>", add_bos=False,
                           chat_template=INTERNVL_TEMPLATE,
                           extra={"start_image_token": "<img>", "end_image_token": "</img>",
                                  "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    image_size, patch = 32, 8
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  image_size=[image_size, image_size], patch_size=[patch, patch])
    seq_len = (image_size // patch) ** 2 // 4
    config = tf.InternVLConfig(text_config=tf.Qwen2Config(**_text(tok)).to_dict(), vision_config=vision,
                               image_token_id=tok.convert_tokens_to_ids("<IMG_CONTEXT>"), image_seq_length=seq_len,
                               downsample_ratio=0.5, tie_word_embeddings=False)
    image = tf.GotOcr2ImageProcessor(size={"height": image_size, "width": image_size}, crop_to_patches=False)
    processor = tf.InternVLProcessor(image_processor=image, tokenizer=tok,
                                     video_processor=tf.InternVLVideoProcessor(), image_seq_length=seq_len,
                                     chat_template=INTERNVL_TEMPLATE)
    return _finish(out_dir, tf.InternVLForConditionalGeneration, config, processor, tok, seed)
