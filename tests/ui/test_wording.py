"""The stats line and queue line users read after and before each answer."""
from __future__ import annotations

from ui import wording


def test_queue_line_with_and_without_eta():
    assert wording.queued(3, 11.6) == "Queued — position 3, about 12 s"
    assert wording.queued(2, None) == "Queued — position 2"
    assert wording.queued(None, None) == "Queued — waiting for a free slot"


def test_follow_up_with_reused_tokens_is_a_session_hit():
    stats = {"ttft_s": 0.5, "decode_tokens_per_s": 40.0, "generated_tokens": 12, "prompt_tokens": 830,
             "cached_tokens": 812}
    line = wording.stats_line(stats, ui_ttft_s=0.21, follow_up=True)
    assert line == "First token 0.21 s · 40.0 tokens/s · 12 tokens · session cache hit (812/830 prompt tokens reused)"


def test_first_turn_reusing_only_the_template_prefix_is_not_a_session_hit():
    line = wording.stats_line({"prompt_tokens": 33, "cached_tokens": 7}, follow_up=False)
    assert line == "session cache miss (7/33 prompt tokens from the shared prefix)"


def test_engine_cache_source_wins_over_the_heuristic():
    assert not wording.session_cache_hit({"cache_source": "prefix", "cached_tokens": 9}, follow_up=True)
    assert wording.session_cache_hit({"cache_source": "session", "cached_tokens": 9}, follow_up=False)


def test_plain_miss():
    assert wording.stats_line({"prompt_tokens": 40, "cached_tokens": 0}) == "session cache miss"
