"""Incremental detokenisation: never half a multi-byte character, never a stop string."""
import pytest
from transformers import AutoTokenizer

from engine.detokenizer import IncrementalDetokenizer
from training.tiny_checkpoint import ensure_tiny_checkpoint


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_tiny_checkpoint("lfm2vl"))


def _stream(tok, text, stop=()):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    d = IncrementalDetokenizer(tok, tuple(stop))
    deltas = [d.add_token(i) for i in ids]
    deltas.append(d.flush())
    return deltas, d


def test_multibyte_characters_are_never_split(tok):
    text = "owl 🦉 日本語 naïve"
    # the byte-level tokenizer splits the emoji and CJK into several byte tokens
    assert len(tok("🦉", add_special_tokens=False)["input_ids"]) > 1
    deltas, d = _stream(tok, text)
    assert "".join(deltas) == text == d.text
    assert all("\ufffd" not in x for x in deltas)


def test_stop_string_is_cut_and_never_emitted(tok):
    deltas, d = _stream(tok, "The circle is red. STOP and more text", stop=["STOP"])
    assert d.stopped
    assert "".join(deltas) == "The circle is red. "
    assert all("STOP" not in x and "STO" not in "".join(deltas) for x in deltas)


def test_partial_stop_prefix_is_released_when_ruled_out(tok):
    deltas, d = _stream(tok, "a STOPPER? no: STO then end", stop=["STOP!"])
    assert not d.stopped
    assert "".join(deltas) == "a STOPPER? no: STO then end"


def test_earliest_of_several_stop_strings_wins(tok):
    deltas, d = _stream(tok, "one two three", stop=["three", "two"])
    assert "".join(deltas) == "one "
