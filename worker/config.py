"""One env-driven settings object for the worker side (client, dispatcher and Celery worker alike)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from engine import limits
from owlet.settings import read_fields

ENV_PREFIX = "OWLET_"  # field user_queue_cap is read from OWLET_USER_QUEUE_CAP
ENV_SKIP = ("redis_url",)  # read from REDIS_URL, the name Celery and Redis tooling use


@dataclass(frozen=True)
class Settings:
    redis_url: str = "redis://127.0.0.1:6379/0"
    key_prefix: str = "owlet:"  # namespaces Owlet's keys and Celery's, so deployments/tests can share a server
    fifo: bool = False  # True disables fair queuing (one shared FIFO); only the fairness benchmark uses it
    user_queue_cap: int = 8  # queued (not yet dispatched) jobs per user
    # queued jobs in total, service-wide; 0 = as many as the Redis's memory budget holds (worker.store.history_budget)
    global_queue_cap: int = 0
    # Per client group (an address, or a login): queued plus running jobs, and admitted turns per window.
    group_job_cap: int = 8
    group_submit_limit: int = 30
    group_submit_window_s: int = 60
    # Bytes of new images stored per identity and per group within image_ttl_s (admission refuses beyond).
    image_quota_user_bytes: int = 64 * 1024 * 1024
    # A sixteenth of the total below: one address filling the total refused every new picture of everyone.
    image_quota_group_bytes: int = 64 * 1024 * 1024
    # ... and the bytes of images the whole service holds at once: eight addresses at their quota would otherwise
    # fill a 2 GB Redis, and with noeviction every turn of everyone would then be refused. Keep it well under
    # Redis's maxmemory.
    image_quota_total_bytes: int = 1024 * 1024 * 1024
    # Bytes of text stored (each turn, and each job's payload, which carries the history so far) per identity and
    # per group in a window of text_quota_window_s from its first charge. Turns live history_ttl_s (a week), so
    # without it one address sending long questions at the submit rate could fill Redis for a week. A long
    # conversation at the history limits (64 turns, 32,000 characters) stores about 1-2 MB of payloads.
    text_quota_user_bytes: int = 8 * 1024 * 1024
    text_quota_group_bytes: int = 32 * 1024 * 1024
    text_quota_window_s: int = 24 * 3600
    holder_ttl_s: int = 24 * 3600  # how long the worker that ran a conversation's last turn stays its holder
    queue_timeout_s: float = 300.0  # a job that cannot start within this ends with an error
    job_deadline_s: float = 300.0  # wall-clock budget for generation once started
    image_ttl_s: int = 24 * 3600
    image_max_bytes: int = limits.UPLOAD_MAX_BYTES
    image_max_side: int = limits.MAX_SIDE  # larger images are downscaled before they reach the engine
    history_ttl_s: int = 7 * 24 * 3600
    # Bytes of conversation history the whole service holds (as worker.store.memory_model charges them); past it the least
    # recently used conversations give way whole. 0 = derived from Redis's maxmemory (worker.store.history_budget).
    history_total_bytes: int = 0
    history_max_turns: int = 64
    history_max_chars: int = 32_000
    max_images_per_request: int = limits.MAX_IMAGES_PER_REQUEST  # the engine's limit (same variable)
    turn_max_chars: int = 8_000
    stream_maxlen: int = 10_000  # token events per job stream (approximate trim)
    # At most one token event per job per this many seconds: tokens that arrive meanwhile share one write
    # (worker.serving.deltas). 0.05 s matches the page's fastest per-answer update rate (20 a second).
    stream_coalesce_s: float = 0.05
    stream_ttl_s: int = 3600  # how long a finished job's stream stays readable
    heartbeat_interval_s: float = 1.0
    heartbeat_ttl_s: float = 4.0  # a worker silent for this long is presumed dead
    max_attempts: int = 2  # a job whose worker died is re-dispatched once, then failed
    cancel_poll_s: float = 0.05
    read_block_ms: int = 1000  # stream reads block below redis-py's 5 s socket timeout
    # How long workers and pages wait for a restarting Redis before giving up on a job or a stream.
    redis_reconnect_s: float = 60.0
    worker_concurrency: int = 0  # Celery threads; 0 = engine max_running + 2
    # A task thread whose job ended takes the next job of the fair queue itself, in the slot that job freed (one
    # Redis round trip), instead of returning to Celery, whose delivery (one message per event-loop turn, each
    # with its own round trips) left rows idle between short answers at a GPU's rate. Off: every job via Celery.
    worker_takes_next: bool = True
    worker_metrics_port: int = 0  # worker Prometheus HTTP port (OWLET_WORKER_METRICS_PORT); 0 = off
    # Seconds between calls to glibc's malloc_trim(0), which gives the heap's freed pages back (owlet/allocator.py);
    # 0 = never.
    malloc_trim_s: float = 30.0
    # "module:callable" building the engine instead of engine.LLMEngine: bench/page_stream.py serves a
    # model-free stub (bench/stub_engine.py) through the real worker this way. "" = the real engine.
    engine_factory: str = ""

    @classmethod
    def from_env(cls, env=None, **overrides) -> "Settings":
        """Read ``REDIS_URL`` and ``OWLET_<FIELD>`` variables (``owlet.settings`` rules); keyword overrides win."""
        env = os.environ if env is None else env
        values = {"redis_url": env.get("REDIS_URL") or cls.redis_url}
        values.update(read_fields(cls, ENV_PREFIX, env, skip=ENV_SKIP))
        values.update(overrides)
        return cls(**values)

    def __post_init__(self):
        # (ValueError, not assert: `python -O` drops asserts, and these must stop a process whatever its flags)
        _require(self.user_queue_cap >= 1, "the per-identity queue cap must be positive")
        _require(self.global_queue_cap >= 0, "global_queue_cap is a number of jobs (0 = derived from Redis's memory)")
        _require(self.group_job_cap >= 1 and self.group_submit_limit >= 1, "per-group limits must be positive")
        _require(self.heartbeat_ttl_s > self.heartbeat_interval_s, "heartbeat TTL must exceed its interval")
        _require(0 < self.read_block_ms < 5000, "blocking reads must stay under redis-py's 5 s socket timeout")
        _require(self.max_attempts >= 1, "max_attempts must be at least 1")
        _require(0 <= self.stream_coalesce_s <= 1, "stream_coalesce_s is seconds between token writes (0 to 1)")
        _require(self.history_total_bytes >= 0, "history_total_bytes is bytes (0 = derived from Redis's maxmemory)")
        # Times and sizes every turn rests on: at 0 every question would time out in line, every answer be cut off at
        # once (the engine refuses a deadline of 0), a stream or conversation expire as it is written, or a wait spin.
        for name in ("queue_timeout_s", "job_deadline_s", "stream_ttl_s", "history_ttl_s", "image_ttl_s",
                     "holder_ttl_s", "heartbeat_interval_s", "cancel_poll_s", "group_submit_window_s",
                     "text_quota_window_s", "turn_max_chars", "history_max_turns", "history_max_chars",
                     "stream_maxlen", "image_max_bytes", "image_max_side"):
            _require(getattr(self, name) > 0, f"{name} must be above 0, got {getattr(self, name)}")
        _require(self.redis_reconnect_s >= 0 and self.malloc_trim_s >= 0 and self.worker_concurrency >= 0,
                 "redis_reconnect_s, malloc_trim_s and worker_concurrency must not be negative")
        _require(0 <= self.worker_metrics_port <= 65535, "worker_metrics_port is a TCP port (0 = off)")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
