"""Queue read-outs: the one ETA, the service-time average it rests on, and the aggregates /metrics may show.

Nothing here changes a job's state (that is ``worker.queue.job_states``); these are plain reads of the counters the
Lua scripts keep, among them the moving average of service times that FINISH folds each job's run time into.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import redis

from worker import heartbeat
from worker.store.keys import Keys, SlotsField, StatField

# How long one reading of the live workers' decode rows serves the ETA: every submit and every waiting tab whose
# place changed asks for it, and a reading costs a read of every worker's heartbeat.
ROWS_FRESH_S = 1.0


@dataclass(frozen=True)
class QueueReadouts:
    r: redis.Redis
    keys: Keys
    _rows: list = field(default_factory=lambda: [0, float("-inf")], compare=False, repr=False)

    def seconds_per_position(self) -> float | None:
        """Expected seconds each queue position adds: mean service time over the live workers' decode rows (answers
        served at once), the rows read at most once a second per process while there are any."""
        service = self.r.hget(self.keys.slots, SlotsField.service_s)
        if service is None:
            return None
        rows = self._live_rows()
        return float(service) / rows if rows else None

    def _live_rows(self) -> int:
        rows, read_at = self._rows
        now = time.monotonic()
        if rows and now - read_at < ROWS_FRESH_S:
            return rows
        rows = sum(w.decode_rows for w in heartbeat.alive(self.r, self.keys).values())
        self._rows[:] = [rows, now]
        return rows

    def eta_s(self, position: int | None) -> float | None:
        """The one queue ETA: seconds until a job at ``position`` should start (None while unknown)."""
        per_position = self.seconds_per_position()
        return None if position is None or per_position is None else round(position * per_position, 1)

    def queued_total(self) -> int:
        return int(self.r.zcard(self.keys.line))  # the line holds each queued question once

    def queue_stats(self, now: float | None = None) -> dict:
        """Aggregates only (no identities, no addresses): what /metrics may show about the queue."""
        now = time.time() if now is None else now
        with self.r.pipeline(transaction=False) as p:
            p.zcard(self.keys.line)
            p.hlen(self.keys.places)
            p.zrange(self.keys.queued_since, 0, 0, withscores=True)
            p.zcard(self.keys.inflight)
            queued, groups, oldest, inflight = p.execute()
        return {"queued": int(queued or 0), "waiting_clients": int(groups),
                "oldest_wait_s": max(0.0, now - oldest[0][1]) if oldest else 0.0, "in_flight": int(inflight)}

    def affinity_stats(self) -> dict:
        """The counters in ``stats`` (affinity hits and misses, reaped, redispatched) and the affinity hit rate."""
        raw = self.r.hgetall(self.keys.stats)
        stats = {k.decode(): int(v) for k, v in raw.items()}
        hits, misses = stats.get(StatField.affinity_hits, 0), stats.get(StatField.affinity_misses, 0)
        stats["affinity_hit_rate"] = hits / (hits + misses) if hits + misses else None
        return stats
