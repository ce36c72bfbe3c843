"""worker.streams.read_events: a reader told to stop by its idle check still reads the job's last events. A job
that ended between an empty wait and that check (its terminal event written just after the wait returned) was
read as never finished: its answer lost to that reader."""
from tests.redis_server import unique_prefix
from worker.keys import JobState
from worker.streams import encode, read_events


def test_a_job_that_ends_during_the_idle_check_is_read_to_its_terminal_event(r):
    key = unique_prefix("stream-read") + "stream"
    r.xadd(key, encode("started", worker="w"))
    looks = []

    def on_idle() -> bool:  # the job ends while the reader looks: its state is terminal, its event just written
        looks.append(True)
        r.xadd(key, encode(JobState.done, text="the whole answer"))
        return False

    try:
        events = [event for _, event in read_events(r, key, "0", block_ms=50, on_idle=on_idle)]
    finally:
        r.delete(key)
    assert looks == [True]
    assert [e["type"] for e in events] == ["started", JobState.done]
    assert events[-1]["text"] == "the whole answer"


def test_a_reader_told_to_stop_with_nothing_more_written_ends(r):
    key = unique_prefix("stream-read") + "stream"
    r.xadd(key, encode("started", worker="w"))
    try:
        events = [event for _, event in read_events(r, key, "0", block_ms=50, on_idle=lambda: False)]
    finally:
        r.delete(key)
    assert [e["type"] for e in events] == ["started"]
