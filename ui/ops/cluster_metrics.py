"""Cluster-wide gauges read at scrape time through the worker client: requests waiting and running, the oldest wait,
how many clients are waiting, live workers, batch occupancy, and the dispatcher's affinity counters. Names follow
vLLM's where it has one (``vllm:num_requests_waiting`` is ``owlet_num_requests_waiting``).

Dispatch and queueing happen in many processes, so these numbers live in Redis; reading them when
Prometheus scrapes keeps every UI replica's ``/metrics`` consistent without any background thread.
Every family is an aggregate with a fixed label set: no user ids, no addresses and no worker names, so a
scrape reveals nothing a stranger could use, and the number of series cannot grow with traffic.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ClusterCollector:
    """A prometheus_client custom collector over an ``OwletClient`` (its public read methods only)."""

    def __init__(self, client):
        self.client = client

    def describe(self):
        return []  # collected lazily: describing must not touch Redis at registration time

    def collect(self):
        try:  # gather everything first: a Redis failure half-way must not produce a torn scrape
            families = list(self._families())
        except Exception:
            families = []
        up = GaugeMetricFamily("owlet_redis_up", "1 when the UI can read the cluster state from Redis.")
        up.add_metric([], 1 if families else 0)
        yield up
        yield from families

    def _families(self):
        q = self.client.queue_stats()
        health = self.client.health()
        yield _gauge("owlet_num_requests_waiting", "Requests (turns) waiting in the fair queue, all clients together.",
                     q["queued"])
        yield _gauge("owlet_num_clients_waiting", "Client groups (addresses or logins) with requests waiting.",
                     q["waiting_clients"])
        yield _gauge("owlet_queue_oldest_wait_seconds", "How long the oldest waiting job has waited.",
                     q["oldest_wait_s"])
        yield _gauge("owlet_num_requests_running", "Requests handed to workers and not finished.", q["in_flight"])
        workers = health.get("workers", [])
        running = sum(w.get("running", 0) for w in workers)
        capacity = sum(max(1, w.get("capacity", 1)) for w in workers)
        yield _gauge("owlet_workers_alive", "Workers with a live heartbeat.", len(workers))
        yield _gauge("owlet_engine_running", "Requests in the engine batches of all live workers.", running)
        yield _gauge("owlet_batch_occupancy", "Engine running / max_running over all live workers.",
                     running / capacity if capacity else 0.0)
        affinity = CounterMetricFamily("owlet_affinity", "Follow-up turns routed to the worker holding their "
                                       "cache (hit) or not (miss).", labels=["result"])
        affinity.add_metric(["hit"], health.get("affinity_hits", 0))
        affinity.add_metric(["miss"], health.get("affinity_misses", 0))
        yield affinity


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, documentation)
    family.add_metric([], value)
    return family
