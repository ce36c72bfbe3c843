"""Varlen decode attention: each run of rows reads only up to its own longest row, with the same tokens."""
import pytest

from engine import greedy
from engine.batch.slot_batch import SlotBatch
from engine.batch.varlen_attention import NAME, attended_positions, plan_segments, varlen_attention
from transformers import AttentionInterface

from .helpers import reference_tokens, run_until_done, serve_staggered
from .test_exactness import workload


def covers(runs, spans):
    """Runs tile the rows in order, and each run reads at least each of its rows' positions."""
    assert [r[0] for r in runs] == [0] + [r[1] for r in runs[:-1]] and runs[-1][1] == len(spans)
    for start, stop, span, ragged in runs:
        assert span == max(spans[start:stop])
        assert ragged == (min(spans[start:stop]) != span)


def test_equal_rows_are_one_unmasked_run():
    assert plan_segments([40, 40, 40], call_cost=0) == [(0, 3, 40, False)]


def test_a_long_row_is_cut_off_from_short_ones():
    spans = [2000, 100, 120, 110, 1900]
    runs = plan_segments(spans, call_cost=256)
    covers(runs, spans)
    assert runs == [(0, 1, 2000, False), (1, 4, 120, True), (4, 5, 1900, False)]
    assert attended_positions(runs) < len(spans) * max(spans) * 0.85


def test_a_high_call_cost_keeps_one_padded_call():
    spans = [300, 10, 250, 40]
    runs = plan_segments(spans, call_cost=10**9)
    assert runs == [(0, 4, 300, True)]
    assert attended_positions(runs) == 4 * 300


@pytest.mark.parametrize("spans", [[5], [9, 3, 9, 3, 9], [1, 2, 3, 4, 5, 6], [60, 50, 40, 30, 1000, 2]])
def test_runs_tile_the_batch(spans):
    for cost in (0, 8, 256, 10**6):
        covers(plan_segments(spans, cost), spans)


def test_varlen_decode_matches_generate(family, make_engine, runners, monkeypatch):
    """Forced to cut at every length change (no call cost), rows of different lengths attend separately, with
    and without masks, while requests arrive and finish; tokens equal generate()'s."""
    engine = make_engine(family, max_running=4)
    assert isinstance(engine.batch, SlotBatch) and engine.batch.segment_call_cost is not None
    assert engine.runner.text_config._attn_implementation == NAME
    engine.batch.segment_call_cost = 0
    read, padded = [], []
    step_inputs = engine.batch.step_inputs

    def counted():
        inputs = step_inputs()
        read.append(engine.batch.last_attended)
        padded.append(len(engine.batch) * engine.batch.cache.kv_len)
        return inputs
    engine.batch.step_inputs = counted
    cut_calls = []  # attention calls that got a plan of more than one run

    def spy(*args, owlet_segments=None, **kwargs):
        if owlet_segments is not None and len(owlet_segments) > 1:
            cut_calls.append(owlet_segments)
        return varlen_attention(*args, owlet_segments=owlet_segments, **kwargs)
    monkeypatch.setitem(AttentionInterface._global_mapping, NAME, spy)
    reqs = workload()
    handles = serve_staggered(engine, reqs)
    for (messages, n), h in zip(reqs, handles):
        assert h.result(timeout=0).token_ids == reference_tokens(runners(family), messages, n)
    assert sum(read) < sum(padded), "no step attended fewer positions than the padded batch"
    assert sum(r == p for r, p in zip(read, padded)) < len(read), "no step was cut into runs"
    assert cut_calls, "the model's attention never received a cut plan"


def test_padded_setting_keeps_one_call(family, make_engine, runners):
    engine = make_engine(family, max_running=3, decode_attention="padded")
    assert engine.batch.segment_call_cost is None
    messages, n = workload()[0]
    h = engine.add_request(messages, greedy(n))
    run_until_done(engine)
    assert h.result(timeout=0).token_ids == reference_tokens(runners(family), messages, n)
