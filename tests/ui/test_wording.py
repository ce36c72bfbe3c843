"""The status line visitors read before and after each answer, and the figures behind it."""
from __future__ import annotations

from ui.shared import wording


def test_the_queue_line_gives_a_place_in_line_and_a_time():
    assert wording.queued(3, 11.6) == "You are 3rd in line, about 12 s"
    assert wording.queued(1, 0.2) == "You are next in line, about 1 s"
    assert wording.queued(2, None) == "You are 2nd in line"
    assert wording.queued(22, 150) == "You are 22nd in line, about 2 min"
    assert wording.queued(None, None) == wording.STARTING
    assert wording.queued(4, 9.0, no_worker=True) == f"You are 4th in line. {wording.NO_WORKER}"
    for line in (wording.queued(3, 11.6), wording.queued(None, None), wording.RESTARTED + " " + wording.queued(1, 2)):
        assert line.startswith(wording.WAITING_STARTS), line


def test_ordinals():
    assert [wording.ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 101, 111, 112)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "101st", "111th", "112th"]


def test_an_answer_says_how_long_it_took_and_keeps_the_figures_for_a_click():
    stats = {"decode_tokens_per_s": 120.0, "generated_tokens": 2, "prompt_tokens": 121, "cached_tokens": 105}
    line = wording.answered(0.53, stats, ui_ttft_s=0.04, follow_up=True)
    assert line == ("Answered in 0.5 s " + wording.FIGURES_OPEN + "First token 0.04 s · 120.0 tokens/s · 2 tokens · "
                    "session cache hit (105/121 prompt tokens reused)" + wording.FIGURES_CLOSE)
    cut = wording.answered(12.4, stats, 0.1, finish_reason="length")
    assert cut.startswith("Answered in 12 s, cut short at its length limit (Settings: Longest answer) <details")
    assert wording.answered(125, {}) == "Answered in 2 min 5 s"
    assert [wording.took(s) for s in (0.04, 0.5, 9.96, 61, 90)] == ["0.04 s", "0.5 s", "10.0 s", "61 s", "1 min 30 s"]


def test_marks_need_no_emoji_font():
    from tests.ui.page_geometry import needs_emoji_font

    assert not needs_emoji_font(wording.waiting("x") + wording.warning("y"))
    assert not needs_emoji_font(" ".join(v for v in vars(wording).values() if isinstance(v, str)))


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
