"""bench.gpu_decode stops with the failure when prefills fail, instead of stepping forever for a batch that never
fills (a device whose transformers could not prefill once looped until its time ran out)."""
import pytest

from bench.gpu_decode import _fill
from engine.handle import RequestHandle
from engine.outputs import FinalResult, FinishReason


class FailingPrefills:
    """An engine whose every prefill ends its request with an error, as a broken model load does."""

    def __init__(self, handles):
        self.batch, self.handles, self.steps = [], handles, 0

    def step(self):
        self.steps += 1
        for h in self.handles:
            if not h.finished:
                h.finish(FinalResult(h.request_id, "", [], FinishReason.ERROR,
                                     error="prefill failed: 'NoneType' has no attribute 'cache'"))
                return


def test_a_batch_that_never_fills_stops_with_the_first_failure():
    handles = [RequestHandle(f"r{i}") for i in range(4)]
    engine = FailingPrefills(handles)
    with pytest.raises(SystemExit, match="prefill failed"):
        _fill(engine, handles, rows=4)
    assert engine.steps <= 4
