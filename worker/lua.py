"""Lua scripts for every queue and job-state mutation, so several UI processes and workers can act at once
without losing or duplicating a job. Each script is one atomic step of the job life cycle:

    submit -> (queued) -> pop -> (dispatched) -> claim -> (started) -> finish -> (done | error | cancelled)
                  ^                                |          |
                  +------------ requeue -----------+----------+   (worker died: once, then finish error)

Key names are built inside the scripts from the prefix, because per-user queue keys are only known there.
"""
from __future__ import annotations

import redis

# Shared helpers, prepended to each script. P is the key prefix (ARGV[1] in every script).
_COMMON = r"""
local P = ARGV[1]
local function uq(user) return P .. 'uq:' .. user end
local function xadd(job, etype, data, maxlen)
  return redis.call('XADD', P .. 'stream:' .. job, 'MAXLEN', '~', maxlen, '*', 'type', etype, 'data', data)
end
-- 1-based position of job under round robin: users ahead in the ring contribute up to i+1 jobs,
-- users behind contribute up to i, where i is the job's index in its own user's queue.
local function position(job, user)
  local i = redis.call('LPOS', uq(user), job)
  if not i then return false end
  local ring = redis.call('LRANGE', P .. 'ring', 0, -1)
  local pos, before = 1 + i, true
  for _, u in ipairs(ring) do
    if u == user then before = false
    else
      local n = redis.call('LLEN', uq(u))
      if before then pos = pos + math.min(n, i + 1) else pos = pos + math.min(n, i) end
    end
  end
  return pos
end
-- 'served' holds users with jobs in flight (or served this round): a user who starts waiting goes ahead
-- of all of them, in arrival order, so a light user never waits behind a round of a heavy user's jobs.
local function unmark_if_idle(quser)
  if redis.call('HEXISTS', P .. 'inflight_by_user', quser) == 0 and redis.call('LLEN', uq(quser)) == 0 then
    redis.call('SREM', P .. 'served', quser)
  end
end
local function leave_ring(quser)
  redis.call('LREM', P .. 'ring', 0, quser)
  unmark_if_idle(quser)
end
local function left_flight(quser)
  if tonumber(redis.call('HINCRBY', P .. 'inflight_by_user', quser, -1)) <= 0 then
    redis.call('HDEL', P .. 'inflight_by_user', quser)
  end
  unmark_if_idle(quser)
end
local function join_ring(quser)
  local ring = redis.call('LRANGE', P .. 'ring', 0, -1)
  for _, u in ipairs(ring) do
    if redis.call('SISMEMBER', P .. 'served', u) == 1 then
      redis.call('LINSERT', P .. 'ring', 'BEFORE', u, quser)
      return
    end
  end
  redis.call('RPUSH', P .. 'ring', quser)
end
local function unqueue(job, quser, user)
  if redis.call('LREM', uq(quser), 1, job) > 0 then
    redis.call('DECR', P .. 'queued')
    if tonumber(redis.call('HINCRBY', P .. 'queued_by_user', user, -1)) <= 0 then
      redis.call('HDEL', P .. 'queued_by_user', user)
    end
    if redis.call('LLEN', uq(quser)) == 0 then leave_ring(quser) end
  end
  redis.call('ZREM', P .. 'queued_since', job)
end
local function finish(job, etype, data, answer, stream_ttl, maxlen, holder)
  local jk = P .. 'job:' .. job
  local state = redis.call('HGET', jk, 'state')
  if state == 'done' or state == 'error' or state == 'cancelled' then return 0 end
  local f = redis.call('HMGET', jk, 'user', 'conv', 'worker', 'qkey', 'turn')
  if state == 'queued' then unqueue(job, f[4] or f[1] or '', f[1] or '') end
  if (state == 'dispatched' or state == 'started') and f[4] then left_flight(f[4]) end
  if f[2] then
    local ck = P .. 'conv:' .. f[2]
    local tk = P .. 'conv:' .. f[2] .. ':turns'
    -- append only right after this job's own question: never twice, never after a truncate removed it
    local question = f[5] and redis.call('LINDEX', tk, tonumber(f[5]))
    if etype == 'done' and answer ~= '' and question and redis.call('LLEN', tk) == tonumber(f[5]) + 1
       and string.find(question, job, 1, true) then
      redis.call('RPUSH', tk, answer)
      if holder ~= '' then redis.call('SET', P .. 'holder:' .. f[2], holder, 'EX', 86400) end
    end
    if redis.call('HGET', ck, 'pending') == job then redis.call('HDEL', ck, 'pending') end
  end
  if f[3] then redis.call('SREM', P .. 'running:' .. f[3], job) end
  redis.call('ZREM', P .. 'inflight', job)
  redis.call('ZREM', P .. 'queued_since', job)
  redis.call('DEL', P .. 'cancel:' .. job)
  redis.call('HSET', jk, 'state', etype)
  redis.call('EXPIRE', jk, stream_ttl)
  xadd(job, etype, data, maxlen)
  redis.call('EXPIRE', P .. 'stream:' .. job, stream_ttl)
  return 1
end
"""

# KEYS: none. ARGV: prefix, job, user, qkey_user, conv, payload, now, user_cap, global_cap, maxlen,
#   stream_ttl, turn_json ('' = no conversation checks: raw jobs), seconds_per_position (for eta_s; '' = unknown)
SUBMIT = _COMMON + r"""
local job, user, quser, conv, payload, now = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local user_cap, global_cap, maxlen, ttl, turn = tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10], ARGV[11], ARGV[12]
local ck = P .. 'conv:' .. conv
if turn ~= '' then
  if redis.call('HGET', ck, 'user') ~= user then return {-3} end
  local pending = redis.call('HGET', ck, 'pending')
  if pending then
    local st = redis.call('HGET', P .. 'job:' .. pending, 'state')
    if st == 'queued' or st == 'dispatched' or st == 'started' then return {-4} end
  end
end
-- the per-user cap counts this user's queued jobs even in FIFO mode, where they share one list
local mine = tonumber(redis.call('HGET', P .. 'queued_by_user', user) or '0')
if mine >= user_cap then return {-1} end
if tonumber(redis.call('GET', P .. 'queued') or '0') >= global_cap then return {-2} end
local jk = P .. 'job:' .. job
if turn ~= '' then
  redis.call('HSET', jk, 'turn', redis.call('RPUSH', ck .. ':turns', turn) - 1)
  redis.call('HSET', ck, 'pending', job)
end
redis.call('HSET', jk, 'payload', payload, 'user', user, 'qkey', quser, 'conv', conv, 'state', 'queued',
           'enqueued_at', now, 'attempts', 0, 'dispatch_n', 0)
redis.call('EXPIRE', jk, ttl)
redis.call('HINCRBY', P .. 'queued_by_user', user, 1)
if redis.call('RPUSH', uq(quser), job) == 1 then join_ring(quser) end
redis.call('INCR', P .. 'queued')
redis.call('ZADD', P .. 'queued_since', now, job)
local pos = position(job, quser)
local eta = 'null'
if ARGV[13] ~= '' then eta = string.format('%.1f', pos * tonumber(ARGV[13])) end
xadd(job, 'queued', '{"position": ' .. pos .. ', "eta_s": ' .. eta .. ', "t": ' .. now .. '}', maxlen)
redis.call('EXPIRE', P .. 'stream:' .. job, ttl)
return {pos}
"""

# ARGV: prefix, capacity, now. Returns {job, dispatch_n, conv} or nil when nothing waits or no slot is free.
POP = _COMMON + r"""
local capacity, now = tonumber(ARGV[2]), ARGV[3]
if redis.call('ZCARD', P .. 'inflight') >= capacity then return nil end
while true do
  local quser = redis.call('LPOP', P .. 'ring')
  if not quser then return nil end
  local job = redis.call('LPOP', uq(quser))
  if redis.call('LLEN', uq(quser)) > 0 then redis.call('RPUSH', P .. 'ring', quser) end
  if job then
    redis.call('DECR', P .. 'queued')
    redis.call('ZREM', P .. 'queued_since', job)
    local jk = P .. 'job:' .. job
    local user = redis.call('HGET', jk, 'user')
    if user and tonumber(redis.call('HINCRBY', P .. 'queued_by_user', user, -1)) <= 0 then
      redis.call('HDEL', P .. 'queued_by_user', user)
    end
    if redis.call('HGET', jk, 'state') == 'queued' then
      redis.call('HINCRBY', P .. 'inflight_by_user', quser, 1)
      redis.call('SADD', P .. 'served', quser)
      local n = redis.call('HINCRBY', jk, 'dispatch_n', 1)
      redis.call('HINCRBY', jk, 'attempts', 1)
      redis.call('HSET', jk, 'state', 'dispatched', 'dispatched_at', now, 'target', '')
      redis.call('ZADD', P .. 'inflight', now, job)
      return {job, n, redis.call('HGET', jk, 'conv') or ''}
    end
  end
end
"""

# ARGV: prefix, job, dispatch_n, worker, now, maxlen. 1 = this worker now owns the job; 0 = stale or duplicate.
CLAIM = _COMMON + r"""
local job, n, worker, now, maxlen = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local jk = P .. 'job:' .. job
if redis.call('HGET', jk, 'state') ~= 'dispatched' or redis.call('HGET', jk, 'dispatch_n') ~= n then return 0 end
redis.call('HSET', jk, 'state', 'started', 'worker', worker, 'started_at', now)
redis.call('SADD', P .. 'running:' .. worker, job)
xadd(job, 'started', '{"worker": "' .. worker .. '", "t": ' .. now .. '}', maxlen)
return 1
"""

# ARGV: prefix, job, type, data_json, answer_turn_json ('' = none), stream_ttl, maxlen, holder_worker ('' = none),
#   only_state ('' = any non-terminal state), only_worker ('' = any): a runner only ends the job it still owns.
FINISH = _COMMON + r"""
local jk = P .. 'job:' .. ARGV[2]
if ARGV[9] ~= '' and redis.call('HGET', jk, 'state') ~= ARGV[9] then return 0 end
if ARGV[10] ~= '' and redis.call('HGET', jk, 'worker') ~= ARGV[10] then return 0 end
return finish(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
"""

# Worker lost: put a dispatched/started job back at the front of its user's queue, or fail it once
# max_attempts dispatches were spent. ARGV: prefix, job, max_attempts, now, maxlen, stream_ttl, error_json
REQUEUE = _COMMON + r"""
local job, max_attempts, now, maxlen, ttl, err = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local jk = P .. 'job:' .. job
local state = redis.call('HGET', jk, 'state')
if state ~= 'dispatched' and state ~= 'started' then return 0 end
if tonumber(redis.call('HGET', jk, 'attempts') or '0') >= max_attempts then
  finish(job, 'error', err, '', ttl, maxlen, '')
  return 2
end
local f = redis.call('HMGET', jk, 'user', 'worker', 'qkey')
if f[2] then redis.call('SREM', P .. 'running:' .. f[2], job) end
redis.call('ZREM', P .. 'inflight', job)
redis.call('HSET', jk, 'state', 'queued', 'worker', '', 'target', '')
left_flight(f[3])
if redis.call('LPUSH', uq(f[3]), job) == 1 then redis.call('LPUSH', P .. 'ring', f[3]) end
redis.call('INCR', P .. 'queued')
redis.call('HINCRBY', P .. 'queued_by_user', f[1], 1)
redis.call('ZADD', P .. 'queued_since', now, job)
local pos = position(job, f[3]) or 1
xadd(job, 'queued', '{"position": ' .. pos .. ', "restart": true, "t": ' .. now .. '}', maxlen)
return 1
"""

# ARGV: prefix, job. Returns the 1-based position or nil.
POSITION = _COMMON + r"""
local jk = P .. 'job:' .. ARGV[2]
if redis.call('HGET', jk, 'state') ~= 'queued' then return nil end
return position(ARGV[2], redis.call('HGET', jk, 'qkey'))
"""


class Scripts:
    """The registered scripts, bound to one Redis client and prefix."""

    def __init__(self, r: redis.Redis, prefix: str):
        self.prefix = prefix
        self.submit = r.register_script(SUBMIT)
        self.pop = r.register_script(POP)
        self.claim = r.register_script(CLAIM)
        self.finish = r.register_script(FINISH)
        self.requeue = r.register_script(REQUEUE)
        self.position = r.register_script(POSITION)

    def call(self, script, *args):
        return script(keys=[], args=[self.prefix, *args])
