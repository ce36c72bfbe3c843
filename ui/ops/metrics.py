"""Prometheus metrics the page records about the turns it serves. Names follow vLLM's where it has one
(``vllm:time_to_first_token_seconds``, from a request's arrival, is ``owlet_time_to_first_token_seconds``, from a
turn's submission, as the visitor sees it).

Each ``UIMetrics`` owns its own ``CollectorRegistry`` (no process-global state), so two apps in one
process, or tests, never share counters. Cluster-wide gauges read from Redis at scrape time are added
by ``ui.ops.cluster_metrics`` onto the same registry.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ui.shared.wording import session_cache_hit

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60, 120)
PER_TOKEN_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2)
TPS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


class UIMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.turns = Counter("owlet_ui_turns", "Turns submitted from the page, by how they ended.",
                             ["outcome"], registry=r)
        self.errors = Counter("owlet_ui_errors", "Errors shown to users, by kind.", ["kind"], registry=r)
        self.refusals = Counter("owlet_ui_refusals", "Requests and turns refused for a limit, by its code (the API's "
                                "error code; refusals_limited: braked after too many refusals).", ["reason"],
                                registry=r)
        self.cancels = Counter("owlet_ui_cancels", "Answers stopped by the user.", registry=r)
        self.queue_wait = Histogram("owlet_request_queue_time_seconds", "Submit to the worker starting the job.",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("owlet_time_to_first_token_seconds",
                              "Submit to the first answer token, as the user sees it (includes queueing).",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.engine_ttft = Histogram("owlet_engine_time_to_first_token_seconds",
                                     "Engine admission to the first token, from the job's final stats.",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("owlet_time_per_output_token_seconds", "Decode time per output token.",
                              buckets=PER_TOKEN_BUCKETS, registry=r)
        self.tokens_per_s = Histogram("owlet_tokens_per_second", "Decode tokens per second of each answer.",
                                      buckets=TPS_BUCKETS, registry=r)
        self.session_cache = Counter("owlet_ui_session_cache", "Follow-up turns whose KV prefix was reused.",
                                     ["result"], registry=r)
        self.api_requests = Counter("owlet_ui_api_requests", "OpenAI-compatible API requests, by how they ended "
                                    "(done, refused, error, cancelled: the client left).", ["outcome"], registry=r)
        self.active_streams = Gauge("owlet_ui_active_streams", "Answers being streamed to browsers now.",
                                    registry=r)

    def observe_done(self, stats: dict | None, follow_up: bool = False) -> None:
        """Record a finished answer's engine stats (the ``done`` event's ``stats``)."""
        stats = stats or {}
        if stats.get("ttft_s") is not None:
            self.engine_ttft.observe(stats["ttft_s"])
        tps = stats.get("decode_tokens_per_s")
        if tps:
            self.tokens_per_s.observe(tps)
            self.tpot.observe(1.0 / tps)
        if stats.get("prompt_tokens"):
            self.session_cache.labels("hit" if session_cache_hit(stats, follow_up) else "miss").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
