"""One worker process's token writes, sent to Redis together.

Each answer's runner writes its tokens to its job's stream, a few at a time (``stream_coalesce_s``). Sent one by one,
every write is a round trip of its own, and on a busy engine those are most of a turn's round trips: Redis spends more
on each (waking, reading the request, writing the reply) than on the write itself. The batcher sends the writes of
all the worker's answers that are waiting in one pipeline: one round trip for all of them. A write waits at most
``window_s`` for others to join it. An answer's first write does not come here (``StreamWriter`` sends it at once),
so the time to the first token never waits; nor does its last: its finish writes it, in the script that ends the job
(``worker.serving.runner``). Nor do the writes of an answer that ends while they wait: the runner takes them back
(``take_back``) and its finish writes them with its last tokens, so an answer's end costs no round trip of its own
(sending them at once cost a busy engine about an eighth of a round trip a turn, ``bench.queue_scale``'s turns).

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

from worker.store.keys import TOKEN_EVENT, EntryField

log = logging.getLogger(__name__)

WINDOW_S = 0.005  # how long a write waits for others to join its round trip: a tenth of stream_coalesce_s's default
RETRY_AFTER_S = 1.0  # after a failed send, writes are dropped this long instead of waiting on each one


class StreamBatcher:
    def __init__(self, r: redis.Redis, window_s: float = WINDOW_S):
        self.r, self.window_s = r, window_s
        self._cond = threading.Condition()
        self._pending: list[tuple[str, dict, int] | None] = []  # (None: taken back, counted as sent with its batch)
        self._handed = 0  # writes handed in so far; each one's number is its place in this count
        self._sent = 0  # of those, the writes sent (or dropped) so far
        self._taken = 0  # of those, the writes the sending thread took (sent, dropped, or on their way now)
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

    def take_back(self, key: str, last: int, timeout_s: float) -> list[dict] | None:
        """An answer's end: the token writes to stream ``key`` still waiting, taken back in order (their fields), for
        its finish to write; those already on their way (up to write ``last``, this stream's last) are waited for, at
        most ``timeout_s``, without hurrying anyone's round trip (what was taken back is returned either way: it is
        nowhere else now). None, and nothing taken back, when a waiting write to ``key`` is not a token event (then
        ``wait_sent``)."""
        with self._cond:
            mine = [i for i, entry in enumerate(self._pending) if entry is not None and entry[0] == key]
            if any(self._pending[i][1].get(EntryField.type) != TOKEN_EVENT for i in mine):
                return None
            taken = [self._pending[i][1] for i in mine]
            for i in mine:
                self._pending[i] = None
            on_their_way = min(last, self._taken)  # (every write still waiting is numbered past what was taken)
            if not self._cond.wait_for(lambda: self._sent >= on_their_way, timeout_s):
                log.warning("stream writes for %s not sent within %.0f s", key, timeout_s)
            return taken

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
                self._taken = self._handed
            writes = [entry for entry in batch if entry is not None]
            if writes:  # (every write of the batch taken back: nothing to send)
                self._send(writes)
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
