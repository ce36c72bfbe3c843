#!lua flags=allow-oom
-- CLAIM: dispatched -> started on a worker.
-- args: job; dispatch_n: the dispatch its Celery message carries; worker: who claims it; now: its clock, as text;
--   stream_maxlen
-- Returns {1, payload, group, cancelled, conv, owner, history, turn} (start_job's) when this worker now owns the
-- job; 0 for a stale or duplicate delivery.
local job, worker, now = args.job, args.worker, args.now
local jk = KEY.job .. job
local seen = redis.call('HMGET', jk, JOB.state, JOB.dispatch_n)
if seen[1] ~= STATE.dispatched or tonumber(seen[2]) ~= args.dispatch_n then return 0 end
local s = start_job(job, worker, now, args.stream_maxlen)
return {1, s[1], s[2], s[3], s[4], s[5], s[6], s[7]}
