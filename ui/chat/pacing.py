"""How often each answer stream may update the page: a fair share of one page-wide budget that follows load.

Every streamed update costs the page process CPU (Gradio post-processes, diffs and sends it) and the browser
a re-render, whatever the model's speed. So the page caps its total update rate, and each live stream gets
an equal share of it: fast when few answers stream (at most ``max_per_stream_per_s`` each), slower when
many do, but never below ``min_per_stream_per_s``. Tokens are never dropped, only coalesced: each update
carries everything that arrived since the last one, and the final update always carries the whole answer.

The cap itself follows what the process can do now. All of an update's work runs on the page's event loop,
so when the page has more to do than one core gives, the loop falls behind and every stream's tokens wait in
line. ``watch_loop_lag`` measures how late the loop wakes a sleeper; the pacer lowers the page budget while the
loop lags (fewer, fuller updates) and raises it back towards ``max_total_per_s`` once it keeps time. Latency
stays bounded instead of a backlog growing; the floor per stream still holds.
"""
from __future__ import annotations

import asyncio
import time

LAG_HIGH_S = 0.03  # the loop is behind: shrink the budget
LAG_LOW_S = 0.008  # the loop keeps time: let the budget grow back
SHRINK, GROW = 0.8, 1.1


class UpdatePacer:
    def __init__(self, max_total_per_s: float, max_per_stream_per_s: float, min_per_stream_per_s: float):
        assert 0 < min_per_stream_per_s <= max_per_stream_per_s, "need 0 < min <= max updates per second"
        assert max_total_per_s >= max_per_stream_per_s, "the page budget must fit at least one full-speed stream"
        self.max_total, self.max_each, self.min_each = max_total_per_s, max_per_stream_per_s, min_per_stream_per_s
        self.budget = max_total_per_s  # the page-wide updates/s allowed now (<= max_total)
        self.live = 0  # streams now following a job (touched only from the event loop)

    def join(self) -> None:
        self.live += 1

    def leave(self) -> None:
        self.live = max(0, self.live - 1)

    def interval_s(self) -> float:
        """The least time between two updates of one stream, given how many stream now."""
        share = self.budget / max(1, self.live)
        return 1.0 / min(self.max_each, max(self.min_each, share))

    def observe_lag(self, lag_s: float) -> None:
        """One reading of how late the event loop ran a timer: adjust the page budget to it."""
        if lag_s > LAG_HIGH_S:
            # Never below what the live streams use at the floor rate: cutting further would not lower it.
            floor = max(self.max_each, self.min_each * self.live)
            self.budget = max(min(floor, self.max_total), self.budget * SHRINK)
        elif lag_s < LAG_LOW_S:
            self.budget = min(self.max_total, self.budget * GROW)


async def watch_loop_lag(pacer: UpdatePacer, period_s: float = 0.05) -> None:
    """Forever: sleep ``period_s`` on the running loop and tell ``pacer`` how late it woke."""
    while True:
        start = time.monotonic()
        await asyncio.sleep(period_s)
        pacer.observe_lag(time.monotonic() - start - period_s)
