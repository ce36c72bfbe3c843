"""Cluster-wide gauges read from Redis at scrape time: per-user queue depth and wait, live workers,
their batch occupancy, and the dispatcher's affinity counters.

Dispatch and queueing happen in many processes, so these numbers live in Redis; reading them when
Prometheus scrapes keeps every UI replica's ``/metrics`` consistent without any background thread.
"""
from __future__ import annotations

import time

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily


class ClusterCollector:
    """A prometheus_client custom collector over an ``OwletClient`` (uses its Redis handle and key names)."""

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
        r, keys = self.client.r, self.client.keys
        yield from self._queues(r, keys)
        yield from self._workers()
        stats = {k.decode(): int(v) for k, v in r.hgetall(keys.stats).items()}
        affinity = CounterMetricFamily("owlet_affinity", "Follow-up turns routed to the worker holding their "
                                       "cache (hit) or not (miss).", labels=["result"])
        affinity.add_metric(["hit"], stats.get("affinity_hits", 0))
        affinity.add_metric(["miss"], stats.get("affinity_misses", 0))
        yield affinity

    def _queues(self, r, keys):
        depth = GaugeMetricFamily("owlet_queue_depth", "Jobs waiting in the fair queue, per user.", labels=["user"])
        wait = GaugeMetricFamily("owlet_queue_oldest_wait_seconds",
                                 "How long each user's oldest waiting job has waited.", labels=["user"])
        total = 0
        for user, n in r.hgetall(f"{keys.prefix}queued_by_user").items():
            depth.add_metric([user.decode()], int(n))
            total += int(n)
        now = time.time()
        for quser in r.lrange(keys.ring, 0, -1):
            head = r.lindex(keys.user_queue(quser.decode()), 0)
            since = r.zscore(keys.queued_since, head) if head is not None else None
            if since is not None:
                wait.add_metric([quser.decode()], max(0.0, now - since))
        all_depth = GaugeMetricFamily("owlet_queue_depth_total", "Jobs waiting in the fair queue in total.")
        all_depth.add_metric([], total)
        yield from (depth, wait, all_depth)

    def _workers(self):
        health = self.client.health()
        alive = GaugeMetricFamily("owlet_workers_alive", "Workers with a live heartbeat.")
        alive.add_metric([], len(health.get("workers", [])))
        occupancy = GaugeMetricFamily("owlet_batch_occupancy", "Engine running / max_running, per worker.",
                                      labels=["worker"])
        running = GaugeMetricFamily("owlet_engine_running", "Requests in each worker's engine batch.",
                                    labels=["worker"])
        for w in health.get("workers", []):
            running.add_metric([w["worker"]], w.get("running", 0))
            occupancy.add_metric([w["worker"]], w.get("running", 0) / max(1, w.get("capacity", 1)))
        yield from (alive, occupancy, running)
