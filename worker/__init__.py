"""Owlet's distributed side: Celery GPU workers, Redis token streams, fair dispatch, affinity and failover.

The UI and benchmarks talk to it through :class:`worker.client.OwletClient`; the engine knows nothing of it.

- ``client``, ``config``, ``errors``: the API, its settings and the errors it raises;
- ``keys``: the Redis data model (every key, and the fields of every hash), which everything below reads;
- ``history``, ``images`` (with ``image_structure``), ``jobs``, ``streams``, ``heartbeat``: what is stored
  in Redis, each with its readers and writers;
- ``queue/``: the fair queue and the job life cycle (Lua scripts, dispatch, reaper);
- ``serving/``: one worker process serving jobs (runtime, runner, start-up checks, metrics);
- ``main``, ``celery_app``, ``tasks``: the entry points and the Celery wiring;
- ``redis_retry``, ``redis_probe``: riding out a Redis restart, and asking whether one answers.
"""
