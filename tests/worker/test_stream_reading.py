"""worker.store.stream_reader.StreamReader.follow: a reader that finds its job ended at an empty wait still reads the
job's last events. A job that ended between an empty wait and that check (its terminal event written just after
the wait returned) was read as never finished: its answer lost to that reader."""
from worker.store.keys import JobState
from worker.store.stream_reader import ENDED, VANISHED
from worker.store.streams import encode


def test_a_job_that_ends_during_the_idle_check_is_read_to_its_terminal_event(client, monkeypatch):
    reader = client.stream_reader
    key = reader.key("j1")
    client.r.xadd(key, encode("started", worker="w"))
    looks = []

    def silent(job_ids):  # the job ends while the reader looks: its state is terminal, its event just written
        looks.append(list(job_ids))
        client.r.xadd(key, encode(JobState.done, text="the whole answer"))
        return {"j1": ENDED}

    monkeypatch.setattr(reader, "block_ms", 50)
    monkeypatch.setattr(reader, "silent", silent)
    events = [event for _, event in reader.follow("j1")]
    assert looks == [["j1"]]
    assert [e["type"] for e in events] == ["started", JobState.done]
    assert events[-1]["text"] == "the whole answer"


def test_a_reader_that_finds_its_job_ended_with_nothing_more_written_ends(client, monkeypatch):
    reader = client.stream_reader
    client.r.xadd(reader.key("j2"), encode("started", worker="w"))
    monkeypatch.setattr(reader, "block_ms", 50)
    monkeypatch.setattr(reader, "silent", lambda job_ids: {"j2": ENDED})
    assert [event["type"] for _, event in reader.follow("j2")] == ["started"]


def test_a_stream_that_vanishes_under_its_reader_ends_with_the_unknown_job_sentence(client, monkeypatch):
    reader = client.stream_reader
    client.r.xadd(reader.key("j3"), encode("started", worker="w"))
    monkeypatch.setattr(reader, "block_ms", 50)
    monkeypatch.setattr(reader, "silent", lambda job_ids: {"j3": VANISHED})
    events = [event for _, event in reader.follow("j3")]
    assert [e["type"] for e in events] == ["started", "error"]
    assert events[-1]["message"] == "This answer is no longer available (unknown or expired job)."
