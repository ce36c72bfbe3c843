"""Time slicing: rows are shared by group, and a paused answer says exactly what it would have said unpaused."""
from dataclasses import dataclass, field

import pytest

from engine import FinishReason, greedy
from engine.request import Status, TimeSlice
from engine.time_slicing import OVERTAKE_LIMIT, next_in_line, rows_by_group, rows_to_pause

from .helpers import chat, image, reference_tokens, run_until_done


@dataclass(eq=False)
class Row:
    group: str | None
    slice_tokens: int = 0
    output_ids: list = field(default_factory=list)  # non-empty: a paused answer
    slicing: TimeSlice = field(default_factory=TimeSlice)


# -- the policy -------------------------------------------------------------------------------------------------
def test_a_newcomer_takes_the_row_of_the_group_holding_most_once_its_slice_is_used():
    running = [Row("a", 70), Row("a", 90), Row("b", 200)]
    newcomer = [Row("c")]
    assert rows_to_pause(running, [], newcomer, max_rows=3, quantum=64) == [running[1]]
    # not before a slice is used, however rich the group
    fresh = [Row("a", 10), Row("a", 20), Row("b", 200)]
    assert rows_to_pause(fresh, [], newcomer, max_rows=3, quantum=64) == [fresh[2]]
    assert rows_to_pause([Row("a", 10), Row("a", 20)], [], newcomer, max_rows=2, quantum=64) == []


def test_free_rows_are_used_before_anyone_is_paused():
    running = [Row("a", 500), Row("a", 500)]
    assert rows_to_pause(running, [], [Row("b")], max_rows=3, quantum=1) == []
    assert len(rows_to_pause(running, [], [Row("b"), Row("c")], max_rows=3, quantum=1)) == 1


def test_a_group_never_pauses_itself_and_none_is_one_group():
    assert rows_to_pause([Row("a", 500)], [], [Row("a")], max_rows=1, quantum=1) == []
    assert rows_to_pause([Row(None, 500)] * 2, [], [Row(None)], max_rows=2, quantum=1) == []


def test_equal_groups_take_turns_and_prefilling_rows_count():
    running = [Row("a", 64), Row("b", 64)]
    # c and d wait with nothing; one row each is owed, and each group gives up one
    assert set(rows_to_pause(running, [], [Row("c"), Row("d")], max_rows=2, quantum=64)) == set(running)
    # a prefilling row of c's already gives c a row: only d is owed one
    assert len(rows_to_pause(running, [Row("c")], [Row("c"), Row("d")], max_rows=3, quantum=64)) == 1


def test_next_in_line_prefers_the_group_with_fewest_rows_then_the_earliest():
    waiting = [Row("a"), Row("b"), Row("a"), Row("c")]
    rows = rows_by_group([Row("a"), Row("b")])
    assert next_in_line(waiting, rows) is waiting[3]
    rows["c"] += 1
    assert next_in_line(waiting, rows) is waiting[0]


def test_a_question_not_started_goes_before_paused_answers_until_they_have_let_enough_go_first():
    paused, newcomer = Row("a", output_ids=[1, 2]), Row("b")
    assert next_in_line([paused, newcomer], rows_by_group([])) is newcomer
    paused.slicing.overtaken = OVERTAKE_LIMIT
    assert next_in_line([paused, newcomer], rows_by_group([])) is paused
    # fewer rows still comes first: a newcomer of a group already running waits behind a paused answer
    assert next_in_line([Row("a", output_ids=[1]), Row("c")], rows_by_group([Row("c")])).group == "a"


def test_a_paused_answer_resumes_after_at_most_the_limit_of_newcomers(make_engine):
    """One row; answers of groups a and b take turns; a stream of short questions from other groups each goes
    ahead of the paused answer, but only OVERTAKE_LIMIT of them per wait."""
    engine = make_engine("lfm2vl", max_running=1, time_slice_tokens=2)
    a = engine.add_request(chat("Tell me about owls."), greedy(40, ignore_eos=True), group="a")
    engine.step()
    b = engine.add_request(chat("Tell me about cats."), greedy(40, ignore_eos=True), group="b")
    for _ in range(4):
        engine.step()
    paused = [r for r in engine.scheduler.waiting if r.status is Status.PAUSED]
    assert len(paused) == 1
    quick = [engine.add_request(chat(f"hi {i}"), greedy(2, ignore_eos=True), group=f"c{i}")
             for i in range(OVERTAKE_LIMIT + 4)]
    while paused[0].status is Status.PAUSED:
        engine.step()
    done_before = sum(h.finished for h in quick)
    assert 1 <= done_before <= OVERTAKE_LIMIT + 1, f"{done_before} newcomers went first"
    run_until_done(engine)
    assert all(len(h.result(0).token_ids) == n for h, n in [(a, 40), (b, 40)] + [(q, 2) for q in quick])


# -- the engine -------------------------------------------------------------------------------------------------
QUESTIONS = ["What colour is it?", "Describe the image in detail, please.", "Is there a circle?", "hi",
             "How many shapes are there, and where is the largest one?"]


def groups_workload():
    """Five answers of five groups, different images, prompt lengths and lengths, for two decode rows."""
    return [(chat(q, None if i == 2 else image(40 + i, (40 + 8 * i, 56))), 14 + 3 * i)
            for i, q in enumerate(QUESTIONS)]


@pytest.mark.parametrize("decode_cache", ["slots", "dynamic"])
def test_paused_answers_equal_generate(family, make_engine, runners, decode_cache):
    engine = make_engine(family, max_running=2, time_slice_tokens=3, decode_cache=decode_cache)
    reqs = groups_workload()
    handles = [engine.add_request(m, greedy(n), group=f"addr:{i}") for i, (m, n) in enumerate(reqs)]
    run_until_done(engine)
    results = [h.result(timeout=0) for h in handles]
    assert engine.stats()["pauses"] >= 5 and all(r.stats.pauses >= 1 for r in results[:2])
    for (messages, n), result in zip(reqs, results):
        assert result.token_ids == reference_tokens(runners(family), messages, n)


def test_a_newcomer_gets_a_row_within_a_slice(family, make_engine):
    """One group fills every row with long answers; another group's question starts within one slice, not when
    the first long answer ends. With time slicing off it waits for that (what the check below tells apart)."""
    for slice_tokens in (4, 0):
        engine = make_engine(family, max_running=3, time_slice_tokens=slice_tokens)
        longs = [engine.add_request(chat(f"Tell me about owls, part {i}."), greedy(60, ignore_eos=True), group="a")
                 for i in range(3)]
        for _ in range(6):
            engine.step()
        newcomer = engine.add_request(chat("hi"), greedy(3, ignore_eos=True), group="b")
        steps = 0
        while not newcomer.finished:
            engine.step()
            steps += 1
        if slice_tokens:
            assert steps <= slice_tokens + 3, f"the newcomer took {steps} steps"
            assert all(not h.finished for h in longs), "the long answers should still be running"
            assert engine.stats()["paused"] == 1
        else:
            assert any(h.finished for h in longs), "without time slicing the newcomer waits for a long answer"
        run_until_done(engine)
        assert all(len(h.result(0).token_ids) == 60 for h in longs)


def test_a_paused_answer_can_be_cancelled_and_the_rest_stay_exact(family, make_engine, runners):
    engine = make_engine(family, max_running=1, time_slice_tokens=2)
    a = (chat("Describe the image in detail, please.", image(7)), 20)
    b = (chat("Is there a circle?"), 12)
    ha = engine.add_request(a[0], greedy(a[1]), group="a")
    for _ in range(4):
        engine.step()
    hb = engine.add_request(b[0], greedy(b[1]), group="b")
    while engine.stats()["paused"] == 0:
        engine.step()
    assert engine.abort(ha.request_id)
    run_until_done(engine)
    cancelled = ha.result(timeout=0)
    assert cancelled.finish_reason is FinishReason.CANCELLED and 0 < len(cancelled.token_ids) < a[1]
    assert hb.result(timeout=0).token_ids == reference_tokens(runners(family), *b)
    assert engine.stats()["paused"] == 0 and not engine.has_work()


def test_a_paused_answer_saves_its_session_for_the_next_turn(family, make_engine, runners):
    engine = make_engine(family, max_running=1, time_slice_tokens=2)
    first = chat("What colour is it?", image(9))
    ha = engine.add_request(first, greedy(10), session_id="conv-a", group="a")
    engine.step()
    engine.step()
    hb = engine.add_request(chat("hi"), greedy(6), group="b")
    run_until_done(engine)
    assert ha.result(0).stats.pauses >= 1
    answer = runners(family).processor.tokenizer.decode(ha.result(0).token_ids, skip_special_tokens=True)
    follow = first + [{"role": "assistant", "content": [{"type": "text", "text": answer}]},
                      {"role": "user", "content": [{"type": "text", "text": "And the shape?"}]}]
    hc = engine.add_request(follow, greedy(8), session_id="conv-a", group="a")
    run_until_done(engine)
    assert hc.result(0).stats.cached_tokens > 0, "the paused-then-finished turn's cache was not kept"
    assert hc.result(0).token_ids == reference_tokens(runners(family), follow, 8)
    assert hb.result(0).token_ids == reference_tokens(runners(family), chat("hi"), 6)


def test_settings_are_checked_and_defaulted():
    from engine import EngineConfig

    assert EngineConfig(model="m", max_running=4).max_active == 16
    assert EngineConfig(model="m", max_running=4, time_slice_tokens=0).max_active == 4
    assert EngineConfig(model="m", max_running=128).max_active == 128 + 256, "no more than max_waiting beyond rows"
    with pytest.raises(ValueError, match="max_active"):
        EngineConfig(model="m", max_running=4, max_active=3)
    with pytest.raises(ValueError, match="max_waiting"):
        EngineConfig(model="m", max_running=4, max_active=40, max_waiting=8)
    with pytest.raises(ValueError, match="time_slice_tokens"):
        EngineConfig(model="m", time_slice_tokens=-1)
