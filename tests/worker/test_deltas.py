"""The worker's token writes: deltas that arrive together cross in one write, and none is lost or delayed."""
from __future__ import annotations

import threading
import time

from engine.handle import RequestHandle
from engine.outputs import FinalResult, FinishReason
from worker.serving.deltas import coalesced_deltas


def _finish(handle: RequestHandle) -> None:
    handle.finish(FinalResult(handle.request_id, "", [], FinishReason.EOS, None))


def test_take_returns_everything_pushed_so_far_and_the_end():
    handle = RequestHandle("r")
    for text in ("a", "b", "c"):
        handle.push_delta(text)
    assert handle.take() == (["a", "b", "c"], False)
    handle.push_delta("d")
    _finish(handle)
    assert handle.take() == (["d"], True)
    assert handle.wait(0.0) is True


def test_a_fast_engine_is_written_in_few_events_with_every_delta_in_order():
    handle = RequestHandle("r")
    deltas = [f"t{i} " for i in range(200)]
    first_pushed = threading.Event()

    def engine():
        handle.push_delta(deltas[0])
        first_pushed.set()
        time.sleep(0.05)  # the first token alone, then a burst: 199 tokens at ~2 ms each
        for text in deltas[1:]:
            handle.push_delta(text)
            time.sleep(0.002)
        _finish(handle)

    threading.Thread(target=engine, daemon=True).start()
    first_pushed.wait(5)
    writes = list(coalesced_deltas(handle, interval_s=0.05))
    assert "".join(text for text, _, _ in writes) == "".join(deltas)
    assert sum(n for _, n, _ in writes) == len(deltas)
    assert writes[0] == (deltas[0], 1, False), "the first token goes out alone, at once"
    assert not any(last for _, _, last in writes[:-1]), "only the write the request ended with is marked last"
    # ~0.45 s of tokens at one write per 50 ms: about 10 writes, not 200 (a write per token).
    assert len(writes) <= 40, f"{len(writes)} writes for {len(deltas)} deltas"


def test_the_end_is_noticed_at_once_not_after_the_interval():
    handle = RequestHandle("r")
    handle.push_delta("only ")
    threading.Timer(0.2, _finish, args=(handle,)).start()
    started = time.monotonic()
    writes = list(coalesced_deltas(handle, interval_s=60.0))  # a sleeper would wait a minute
    assert writes == [("only ", 1, False)], "written at once, before the end: nothing is left for the finish"
    assert time.monotonic() - started < 30.0, "the wait between writes must end when the request does"


def test_interval_zero_writes_each_take_as_it_comes():
    handle = RequestHandle("r")
    for text in ("x", "y"):
        handle.push_delta(text)
    _finish(handle)
    assert list(coalesced_deltas(handle, interval_s=0.0)) == [("xy", 2, True)]
