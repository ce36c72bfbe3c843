"""A job's text deltas as the worker publishes them: everything that arrived since the last write, in one write.

The engine pushes one delta per token. Writing each as its own stream entry costs the worker a thread wake-up
and a Redis round trip per token, in the process whose GIL the engine loop needs: at 64 answers of 40 tokens a
second that was most of a core (``bench/page_stream.py``), and it grows with the model's speed. The page shows
at most ``1 / stream_min_interval_s`` updates a second per answer anyway, so the worker writes at most one token
event per ``interval_s`` per job. The first delta goes out at once (time to first token is not delayed), the
end is noticed at once (the final event is not delayed), and no text is ever dropped: the events' texts, in
order, are exactly the deltas, joined.

Each write says whether it is the answer's last: the runner hands that one to the job's finish, which writes it
just before the terminal event in the same script call, so an answer's end costs no round trip of its own.
"""
from __future__ import annotations

from collections.abc import Iterator


def coalesced_deltas(handle, interval_s: float) -> Iterator[tuple[str, int, bool]]:
    """Yield ``(text, n_deltas, last)``: the joined deltas available at each write, at most one per ``interval_s``;
    ``last`` marks the write the request ended with (nothing follows it).

    ``handle`` is an engine request handle: ``take()`` waits for at least one delta and returns
    ``(deltas, ended)``; ``wait(timeout)`` sleeps until the timeout or the request's end.
    """
    while True:
        deltas, ended = handle.take()
        text = "".join(deltas)
        if text:
            yield text, len(deltas), ended
        if ended:
            return
        if interval_s > 0:
            handle.wait(interval_s)  # let this interval's tokens gather; wakes at once if the request ends
