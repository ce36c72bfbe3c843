"""The fair queue and the job life cycle, kept in Redis.

- ``scripts``: the Lua scripts (one atomic step each), and ``fairness``: the values they weigh a group's usage by;
- ``job_states``: the one place that runs them, a named method per transition;
- ``dispatch``: moves waiting jobs to Celery while workers have room, with conversation affinity;
- ``reaper``: ends or requeues jobs whose worker, dispatch or deadline was lost;
- ``readouts``: the queue's ETA and the aggregates /metrics shows.
"""
