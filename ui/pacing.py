"""How often each answer stream may update the page: a fair share of one page-wide budget.

Every streamed update costs the page process CPU (Gradio post-processes, diffs and sends it) and the browser
a re-render, whatever the model's speed. So the page caps its total update rate, and each live stream gets
an equal share of it: fast when few answers stream (at most ``max_per_stream_per_s`` each), slower when
many do, but never below ``min_per_stream_per_s``. Tokens are never dropped, only coalesced: each update
carries everything that arrived since the last one, and the final update always carries the whole answer.
"""
from __future__ import annotations


class UpdatePacer:
    def __init__(self, max_total_per_s: float, max_per_stream_per_s: float, min_per_stream_per_s: float):
        assert 0 < min_per_stream_per_s <= max_per_stream_per_s, "need 0 < min <= max updates per second"
        assert max_total_per_s >= max_per_stream_per_s, "the page budget must fit at least one full-speed stream"
        self.max_total, self.max_each, self.min_each = max_total_per_s, max_per_stream_per_s, min_per_stream_per_s
        self.live = 0  # streams now following a job (touched only from the event loop)

    def join(self) -> None:
        self.live += 1

    def leave(self) -> None:
        self.live = max(0, self.live - 1)

    def interval_s(self) -> float:
        """The least time between two updates of one stream, given how many stream now."""
        share = self.max_total / max(1, self.live)
        return 1.0 / min(self.max_each, max(self.min_each, share))
