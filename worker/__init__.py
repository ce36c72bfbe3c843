"""Owlet's distributed side: Celery GPU workers, Redis token streams, fair dispatch, affinity and failover.

The UI and benchmarks talk to it through :class:`worker.client.OwletClient`; the engine knows nothing of it.
"""
