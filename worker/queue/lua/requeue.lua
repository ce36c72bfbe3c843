#!lua flags=allow-oom
-- REQUEUE: dispatched | started -> queued, for a job whose worker was lost: back at the front of its identity's
-- queue (and, when its group had nothing else waiting, its group ahead of everyone in line), or failed once
-- max_attempts dispatches were spent, or ended cancelled if its user stopped it meanwhile (the lost worker never read
-- the flag).
-- args: job; max_attempts; now: the caller's clock, as text; error: the error event's JSON; stream_ttl_s,
--   stream_maxlen
--   only_state, only_worker (optional): put it back only while it is in this state / started on this worker, so a
--   sweep that saw a job lost acts on that job only as it saw it (not after another worker started it meanwhile)
-- Returns 1 = queued again, 2 = failed, 3 = cancelled, 0 = it was no longer dispatched or started (or not as given).
local job, now, maxlen, ttl = args.job, args.now, args.stream_maxlen, args.stream_ttl_s
local jk = KEY.job .. job
local seen = redis.call('HMGET', jk, JOB.state, JOB.worker)
local state = seen[1]
if state ~= STATE.dispatched and state ~= STATE.started then return 0 end
if (args.only_state and state ~= args.only_state) or (args.only_worker and seen[2] ~= args.only_worker) then
  return 0
end
if redis.call('EXISTS', KEY.cancel .. job) == 1 then
  finish(job, STATE.cancelled, '{"t": ' .. now .. '}', '', ttl, maxlen, '', 0)
  return 3
end
if tonumber(redis.call('HGET', jk, JOB.attempts) or '0') >= args.max_attempts then
  finish(job, STATE.error, args.error, '', ttl, maxlen, '', 0)
  return 2
end
local f = redis.call('HMGET', jk, JOB.user, JOB.worker, JOB.qkey, JOB.group, JOB.qgroup)
local user = f[1] or ''
local q, group = f[3] or user, f[4] or user
local qg = f[5] or group
if f[2] then
  redis.call('SREM', KEY.running .. f[2], job)
  redis.call('SREM', KEY.cancels .. f[2], job)
end
redis.call('ZREM', KEY.inflight, job)
redis.call('ZREM', KEY.unclaimed, job)
redis.call('HSET', jk, JOB.state, STATE.queued, JOB.worker, '', JOB.target, '')
left_flight(group, qg)
-- its identity asked again meanwhile, from another group, and that question waits: this one joins it in that group's
-- turn, ahead of it (queue_group_of)
if q == user then
  local joined = queue_group_of(q)
  if joined and joined ~= qg then
    qg = joined
    redis.call('HSET', jk, JOB.qgroup, qg)
  end
end
local waiting = in_line(qg)
local by_arrival = arrival_ordered(qg)
if by_arrival then  -- ahead of every job of FIFO mode's group, the latest put back first
  local turn = -next_seq()
  redis.call('ZADD', KEY.fifo_line, turn, job)
  if waiting then redis.call('ZADD', KEY.line, turn, redis.call('HGET', KEY.places, qg) .. job) end
elseif redis.call('LPUSH', uq(q), job) == 1 then
  redis.call('LPUSH', gq(qg), q)
end
if not waiting then
  join_line(qg, true)
elseif not by_arrival then
  rekey(qg)
end
queued_by_user_add(user, q, 1)
redis.call('HINCRBY', KEY.queued_by_group, group, 1)
redis.call('ZADD', KEY.queued_since, now, job)
local pos = position(job, q, qg, now_s()) or 1
xadd(job, STATE.queued, queued_event(pos, now, ', "restart": true'), maxlen)
return 1
