"""Every Redis key Owlet uses, in one place, under one prefix."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str

    def image(self, sha: str) -> str:
        return f"{self.prefix}img:{sha}"

    def conversation(self, conv: str) -> str:
        """Hash: user, created, pending (job id of the unanswered turn)."""
        return f"{self.prefix}conv:{conv}"

    def turns(self, conv: str) -> str:
        """List of JSON turns {role, text, image_sha}."""
        return f"{self.prefix}conv:{conv}:turns"

    def job(self, job_id: str) -> str:
        """Hash: payload (JSON) and state fields."""
        return f"{self.prefix}job:{job_id}"

    def stream(self, job_id: str) -> str:
        return f"{self.prefix}stream:{job_id}"

    def cancel(self, job_id: str) -> str:
        return f"{self.prefix}cancel:{job_id}"

    def user_queue(self, user: str) -> str:
        return f"{self.prefix}uq:{user}"

    @property
    def ring(self) -> str:
        """List of users with waiting jobs, in round-robin order."""
        return f"{self.prefix}ring"

    @property
    def queued_count(self) -> str:
        return f"{self.prefix}queued"

    @property
    def queued_since(self) -> str:
        """Zset job -> enqueue time, for queue timeouts."""
        return f"{self.prefix}queued_since"

    @property
    def inflight(self) -> str:
        """Zset job -> dispatch time: jobs handed to Celery and not finished."""
        return f"{self.prefix}inflight"

    @property
    def workers(self) -> str:
        """Set of every worker name ever seen; the reaper checks their heartbeats."""
        return f"{self.prefix}workers"

    def heartbeat(self, worker: str) -> str:
        return f"{self.prefix}hb:{worker}"

    def running(self, worker: str) -> str:
        """Set of job ids started on ``worker``."""
        return f"{self.prefix}running:{worker}"

    def holder(self, conv: str) -> str:
        """Name of the worker that ran the conversation's last turn (holds its KV cache)."""
        return f"{self.prefix}holder:{conv}"

    @property
    def stats(self) -> str:
        """Hash of counters: affinity_hits, affinity_misses, redispatched, reaped."""
        return f"{self.prefix}stats"

    @property
    def service_time(self) -> str:
        """Moving average of one job's run time in seconds (for queue ETAs)."""
        return f"{self.prefix}service_s"

    @property
    def celery_queue(self) -> str:
        return f"{self.prefix}jobs"
