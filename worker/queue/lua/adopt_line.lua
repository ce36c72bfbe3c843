#!lua flags=allow-oom
-- ADOPT_LINE: questions left waiting in the line's earlier form (KEY.legacy_ring: a list of groups walked from the
-- front, without the sorted set), put in the line in that order, so that a deployment upgraded while people wait
-- loses none of them. Each group's identities and jobs are the lists the line reads already; the groups join in the
-- order the old list held them, and the dispatched jobs no worker has started yet become unclaimed. The set of groups
-- served that earlier versions kept goes too (the line reads a group's jobs in flight instead), and so does their
-- service-time average of its own (KEY.slots keeps it now: one job's run time sets it again), their count of the
-- questions waiting (the line's size is the count), and their hash of every group's usage (a key a group now; what
-- it held decays within minutes, so it is not carried over), and their hash of each idle group's member (a group's
-- place names it). FIFO mode's shared group kept its jobs in the lists every group has: they move to KEY.fifo_line in
-- the lists' order (the order it serves them, jobs put back first), tagged afresh by arrival, and the line's tags and
-- the group's idle index with them. Run when a worker starts; a second run finds nothing to do.
-- args: none
-- Returns the number of groups put in the line.
local fifo_jobs = redis.call('LRANGE', uq(FIFO_GROUP), 0, -1)
for _, job in ipairs(fifo_jobs) do redis.call('ZADD', KEY.fifo_line, next_seq(), job) end
redis.call('DEL', uq(FIFO_GROUP), gq(FIFO_GROUP))
if #fifo_jobs > 0 and redis.call('HGET', KEY.places, FIFO_GROUP) then rekey(FIFO_GROUP) end
local groups = redis.call('LRANGE', KEY.legacy_ring, 0, -1)
local joined = 0
for _, qg in ipairs(groups) do
  if in_line(qg) and not redis.call('HGET', KEY.places, qg) then
    redis.call('HSET', KEY.places, qg, waiting_place(now_s()))
    rekey(qg)
    joined = joined + 1
  end
end
-- (UNLINK: the earlier usage hash may hold a field for every group served in weeks; Redis frees it in the background)
redis.call('UNLINK', KEY.legacy_ring, KEY.legacy_ring_keys, KEY.legacy_served, KEY.legacy_service_time,
           KEY.legacy_queued_count, KEY.legacy_group_usage, KEY.legacy_idle_members)
for _, job in ipairs(redis.call('ZRANGE', KEY.inflight, 0, -1)) do
  if redis.call('HGET', KEY.job .. job, JOB.state) == STATE.dispatched then
    redis.call('ZADD', KEY.unclaimed, redis.call('ZSCORE', KEY.inflight, job), job)
  end
end
return joined
