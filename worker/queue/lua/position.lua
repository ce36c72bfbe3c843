#!lua flags=no-writes,allow-oom
-- POSITION: a queued job's 1-based place in the order the queue will serve it (read only).
-- args: job
-- Returns the position, or nil when the job is not queued.
local jk = KEY.job .. args.job
if redis.call('HGET', jk, JOB.state) ~= STATE.queued then return nil end
local q = redis.call('HGET', jk, JOB.qkey)
return position(args.job, q) or nil
