"""One worker process serving jobs: its runtime around the engine, the job runner, and what keeps them healthy.

- ``runtime``: what the process owns (engine, Redis clients, heartbeat and cancel-watch threads);
- ``runner``: one job, from claim to its terminal event; ``deltas``: how its tokens are written;
- ``startup``: why a worker cannot serve, said before Celery reports "ready";
- ``consumer_tick``: keeps Celery's consumer asking for jobs while every thread is busy;
- ``metrics``: the worker's own Prometheus metrics.
"""
