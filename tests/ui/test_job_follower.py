"""Folding stream events into what the page shows (the pure part of ui.chat.job_follower)."""
from __future__ import annotations

from ui.chat.job_follower import Progress, _apply
from ui.shared import wording


def fold(*events) -> Progress:
    progress = Progress()
    for event in events:
        _apply(progress, event)
    return progress


def test_a_normal_answer():
    p = fold({"type": "queued", "position": 2, "eta_s": 3.2}, {"type": "started", "worker": "w"},
             {"type": "token", "text": "a red "}, {"type": "token", "text": "circle"},
             {"type": "done", "text": "a red circle", "finish_reason": "eos", "stats": {"prompt_tokens": 9}})
    assert (p.state, p.answer, p.finish_reason, p.stats) == ("done", "a red circle", "eos", {"prompt_tokens": 9})
    assert p.first_token_s is not None and p.queue_wait_s is not None and p.run_s is not None
    assert p.total_s is not None and p.total_s >= p.run_s


def test_queued_line_shows_position_and_eta():
    p = fold({"type": "queued", "position": 3, "eta_s": 11.6})
    assert p.status == "You are 3rd in line, about 12 s" and not p.finished


def test_a_restart_after_a_lost_worker_discards_the_partial_answer():
    p = fold({"type": "queued", "position": 1, "eta_s": None}, {"type": "started"},
             {"type": "token", "text": "half an ans"},
             {"type": "queued", "position": 1, "eta_s": 2.0, "restart": True})
    assert p.state == "queued" and p.answer == "" and p.first_token_s is None
    assert p.status.startswith(wording.RESTARTED)
    _apply(p, {"type": "started"})
    _apply(p, {"type": "token", "text": "fresh"})
    assert p.answer == "fresh"


def test_error_and_cancel_end_the_turn():
    assert fold({"type": "error", "message": "could not start in time"}).error == "could not start in time"
    p = fold({"type": "token", "text": "x"}, {"type": "cancelled"})
    assert p.state == "cancelled" and p.finished and p.answer == "x"
