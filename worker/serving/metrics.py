"""Worker-side Prometheus metrics. One ``WorkerMetrics`` per worker process, on its own registry.

The UI process exports the cluster-wide ones (queue depth, per-user wait, and the affinity counters, which live
in Redis because dispatch happens in many processes: ``owlet_affinity_total``), so workers do not repeat them.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class WorkerMetrics:
    def __init__(self, worker: str):
        self.registry = CollectorRegistry()
        labels = {"worker": worker}
        reg = self.registry

        def const(metric):
            return metric.labels(**labels)

        self.ttft_s = const(Histogram("owlet_worker_ttft_seconds", "Job start to first token", ["worker"],
                                      buckets=_LATENCY_BUCKETS, registry=reg))
        self.tpot_s = const(Histogram("owlet_worker_time_per_output_token_seconds", "Gap between tokens",
                                      ["worker"], buckets=_LATENCY_BUCKETS, registry=reg))
        self.tokens = const(Counter("owlet_generation_tokens", "Tokens generated (vLLM's generation_tokens)",
                                    ["worker"], registry=reg))
        self.tokens_per_s = const(Gauge("owlet_worker_tokens_per_second", "Decode rate of the last job",
                                        ["worker"], registry=reg))
        self.jobs = Counter("owlet_worker_jobs", "Finished jobs by outcome", ["worker", "outcome"], registry=reg)
        self.errors = Counter("owlet_worker_errors", "Jobs ended with an error, by kind", ["worker", "kind"],
                              registry=reg)
        self.cancels = const(Counter("owlet_worker_cancels", "Cancel flags relayed to the engine", ["worker"],
                                     registry=reg))
        self.running = const(Gauge("owlet_worker_running", "Requests in the engine batch", ["worker"], registry=reg))
        self.batch_occupancy = const(Gauge("owlet_worker_batch_occupancy", "running / max_running", ["worker"],
                                           registry=reg))
        self.paused = const(Gauge("owlet_worker_paused", "Answers paused for another client's (time slicing)",
                                  ["worker"], registry=reg))
        self.pauses = const(Gauge("owlet_worker_pauses", "Times the engine paused an answer since it started",
                                  ["worker"], registry=reg))
        self.cache = Gauge("owlet_worker_cache", "Engine session and image cache counters",
                           ["worker", "stat"], registry=reg)
        self.worker = worker

    def job_finished(self, outcome: str) -> None:
        self.jobs.labels(worker=self.worker, outcome=outcome).inc()

    def error(self, kind: str) -> None:
        self.errors.labels(worker=self.worker, kind=kind).inc()

    def observe_engine(self, stats: dict) -> None:
        running, max_running = stats.get("running", 0), max(1, stats.get("max_running", 1))
        self.running.set(running)
        self.batch_occupancy.set(running / max_running)
        self.paused.set(stats.get("paused", 0))
        self.pauses.set(stats.get("pauses", 0))
        for key in ("session_hits", "session_partial_hits", "session_misses", "session_evictions", "session_bytes",
                    "prefix_hits", "disk_hits", "disk_misses", "disk_dropped", "disk_evictions", "disk_bytes",
                    "disk_files", "disk_skipped_slower"):
            if isinstance(stats.get(key), (int, float)):
                self.cache.labels(worker=self.worker, stat=key).set(stats[key])
        for key, value in (stats.get("image_cache") or {}).items():
            self.cache.labels(worker=self.worker, stat=f"image_{key}").set(value)

    def serve(self, port: int):
        """Serve /metrics on ``port`` in a daemon thread; returns the server (call ``shutdown()`` to stop)."""
        server, _thread = start_http_server(port, registry=self.registry)
        return server
