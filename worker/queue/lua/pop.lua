#!lua flags=allow-oom
-- POP: queued -> dispatched. The next job round robin across groups and their identities, while fewer than
-- `capacity` jobs are in flight. The first `shared` slots (the workers' decode rows) go round robin; the slots
-- beyond them only to groups with nothing in flight, so a newcomer's question reaches an engine, whose time slicing
-- then gives it a row, however many long answers the groups already served keep in flight. Past `light_from` in
-- flight, only to such a group that has used the workers little lately (weighted usage within USAGE_CAP), the one
-- that used them least first: a crowd of addresses with one long answer each has nothing in flight either while it
-- waits, and without these slots it would take every one, so a visitor at the front of the line would still wait
-- for a whole answer to end; and crowd addresses whose usage decayed below the bound while they waited must not go
-- before a visitor who has used nothing.
--
-- args: capacity, shared, light_from (jobs in flight, as above); now: the caller's clock, as text
--   worker (optional): a worker taking its next job itself, in the slot a job of its own just freed. The job goes
--   straight to started on it (CLAIM's writes, start_job) unless another worker holds its conversation's cache:
--   then it stays dispatched, for the caller to route to that worker as any dispatch does. stream_maxlen with it.
-- Returns {job, dispatch_n, conv}, with 1, start_job's first five fields, 1 if `worker` held the conversation (else 0)
-- and start_job's history and turn after them when `worker` took it; nil when nothing waits or no slot is free. The
-- step itself is dispatch.lua's pop_next.
return pop_next(args.capacity, args.shared, args.light_from, args.now, args.worker, args.stream_maxlen)
