"""DynamicBatch.add (merge) and .filter (drop rows), each checked directly against unbatched decoding."""
import torch

from engine.batch.dynamic_batch import DynamicBatch
from engine.prompt import PromptBuilder
from engine.request import Request
from engine.handle import RequestHandle
from engine.detokenizer import IncrementalDetokenizer
from engine.sampling_params import SamplingParams

from .helpers import chat, image


def _prefilled(runner, messages):
    builder = PromptBuilder(runner.processor, runner.image_token_id, max_image_pixels=1 << 20, max_images=4)
    req = Request("r", builder.build(messages), SamplingParams(), RequestHandle("r"),
                  IncrementalDetokenizer(runner.processor.tokenizer))
    logits = runner.prefill(req, req.prompt_len)
    return req, int(logits.argmax())


def _alone(runner, messages, steps: int) -> list[torch.Tensor]:
    """Decode logits of one request in a batch of one, for ``steps`` greedy steps."""
    req, tok = _prefilled(runner, messages)
    batch = DynamicBatch(runner.device, runner.max_model_len)
    batch.add(req, req.cache, req.prompt_len, tok)
    out = []
    for _ in range(steps):
        logits, cache = runner.decode(batch)
        out.append(logits[0])
        batch.advance(cache, [int(logits[0].argmax())])
    return out


CHATS = [chat("hi"), chat("What colour is the big circle in the middle?", image(1, (96, 64))),
         chat("Where?", image(2, (48, 48)))]


def test_merge_matches_unbatched(family, runners):
    runner = runners(family)
    expected = [_alone(runner, c, 3) for c in CHATS]
    batch = DynamicBatch(runner.device, runner.max_model_len)
    for c in CHATS:  # different prompt lengths: the merge pads on both sides of the comparison
        req, tok = _prefilled(runner, c)
        batch.add(req, req.cache, req.prompt_len, tok)
    assert len(set(int(x) for x in batch.seq_lens)) == 3
    for step in range(3):
        logits, cache = runner.decode(batch)
        for row in range(3):
            torch.testing.assert_close(logits[row], expected[row][step], rtol=1e-4, atol=1e-4)
            assert int(logits[row].argmax()) == int(expected[row][step].argmax())
        batch.advance(cache, [int(l.argmax()) for l in logits])


def test_filter_matches_unbatched(family, runners):
    runner = runners(family)
    expected = [_alone(runner, c, 3) for c in CHATS]
    batch = DynamicBatch(runner.device, runner.max_model_len)
    for c in CHATS:
        req, tok = _prefilled(runner, c)
        batch.add(req, req.cache, req.prompt_len, tok)
    logits, cache = runner.decode(batch)
    batch.advance(cache, [int(l.argmax()) for l in logits])
    longest = int(batch.seq_lens.argmax())
    keep = [i for i in range(3) if i != longest]  # dropping the longest row also trims shared left padding
    padded_before = batch.padded_len
    batch.filter(keep)
    assert batch.padded_len < padded_before
    assert batch.padded_len == int(batch.seq_lens.max())
    for step in (1, 2):
        logits, cache = runner.decode(batch)
        for row, orig in enumerate(keep):
            torch.testing.assert_close(logits[row], expected[orig][step], rtol=1e-4, atol=1e-4)
        batch.advance(cache, [int(l.argmax()) for l in logits])
    batch.filter([])
    assert len(batch) == 0 and batch.cache is None
