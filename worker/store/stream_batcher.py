"""One worker process's token writes, sent to Redis together.

Each answer's runner writes its tokens to its job's stream, a few at a time (``stream_coalesce_s``). Sent one by one,
every write is a round trip of its own, and on a busy engine those are most of a turn's round trips: Redis spends more
on each (waking, reading the request, writing the reply) than on the write itself. The batcher sends the writes of
all the worker's answers that are waiting in one pipeline: one round trip for all of them. A write waits at most
``window_s`` for others to join it. An answer's first write does not come here (``StreamWriter`` sends it at once),
so the time to the first token never waits; nor does its last: its finish writes it, in the script that ends the job
(``worker.serving.runner``).

Each stream's writes reach Redis in the order they were handed in (one thread sends them, in that order), and a
runner waits for its own writes (``wait_sent``) before its job's terminal event, which a script writes: the last
token never lands after ``done``. While Redis is unreachable, writes are dropped, as ``StreamWriter`` drops them
(the terminal event carries the whole answer), for ``RETRY_AFTER_S`` after each failed send.
"""
from __future__ import annotations

import logging
import threading
import time

import redis

log = logging.getLogger(__name__)

WINDOW_S = 0.005  # how long a write waits for others to join its round trip: a tenth of stream_coalesce_s's default
RETRY_AFTER_S = 1.0  # after a failed send, writes are dropped this long instead of waiting on each one


class StreamBatcher:
    def __init__(self, r: redis.Redis, window_s: float = WINDOW_S):
        self.r, self.window_s = r, window_s
        self._cond = threading.Condition()
        self._pending: list[tuple[str, dict, int]] = []
        self._handed = 0  # writes handed in so far; each one's number is its place in this count
        self._sent = 0  # of those, the writes sent (or dropped) so far
        self._skip_until = 0.0
        self._closed = False
        self._hurry = threading.Event()  # a runner waits for its writes: send without waiting out the window
        self.round_trips = 0  # pipelines sent, for tests and benchmarks
        self._thread = threading.Thread(target=self._run, name="stream-batcher", daemon=True)
        self._thread.start()

    def add(self, key: str, fields: dict, maxlen: int) -> int:
        """Hand in one XADD (approximate ``maxlen``) to stream ``key``; returns its number for ``wait_sent``."""
        with self._cond:
            self._handed += 1
            if self._closed or time.monotonic() < self._skip_until:
                self._sent += 1  # dropped: Redis was unreachable a moment ago (or the worker is stopping)
            else:
                self._pending.append((key, fields, maxlen))
                self._cond.notify_all()
            return self._handed

    def wait_sent(self, number: int, timeout_s: float) -> bool:
        """Wait until write ``number`` and every write before it were sent (or dropped); False on timeout. The writes
        waiting go out at once: an answer that has ended does not wait out the window."""
        with self._cond:
            if self._sent >= number:
                return True
            self._hurry.set()
            return self._cond.wait_for(lambda: self._sent >= number, timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        """Send what is waiting, then stop."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._hurry.set()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._pending or self._closed)
                if self._closed and not self._pending:
                    return
            if not self._closed:  # let the other answers' writes join this round trip
                self._hurry.wait(self.window_s)
                self._hurry.clear()
            with self._cond:
                batch, self._pending = self._pending, []
            self._send(batch)
            with self._cond:
                self._sent += len(batch)
                self._cond.notify_all()

    def _send(self, batch: list[tuple[str, dict, int]]) -> None:
        try:
            with self.r.pipeline(transaction=False) as p:
                for key, fields, maxlen in batch:
                    p.xadd(key, fields, maxlen=maxlen, approximate=True)
                p.execute()
            self.round_trips += 1
        except redis.RedisError as exc:  # unreachable (restarting), or refused: the answers go on without these
            log.warning("Redis refused or did not answer %d stream writes; dropped, and writes for the next %.0f s "
                        "too (%s)", len(batch), RETRY_AFTER_S, exc)
            with self._cond:
                self._skip_until = time.monotonic() + RETRY_AFTER_S
