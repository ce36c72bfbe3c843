"""Lua scripts for every queue and job-state mutation, so several UI processes and workers can act at once
without losing or duplicating a job. Each script is one atomic step of the job life cycle:

    submit -> (queued) -> pop -> (dispatched) -> claim -> (started) -> finish -> (done | error | cancelled)
                  ^                                |          |
                  +------------ requeue -----------+----------+   (worker died: once, then finish error)

The queue has two levels. The ring holds client *groups* (a client address, or a login); each group's list
holds its *identities* with waiting jobs; each identity has its own list of jobs. POP takes the next group,
its next identity, and that identity's oldest job, so fifty identities made up at one address get one
address's share.

Key names come from ``worker.keys``: the fixed ones through KEYS, the prefixes of keys only a script can
discover (a job's conversation, the next identity's queue) as JSON in ARGV[1]. Every other ARGV is data.

Scripts start with a ``#!lua`` shebang, which makes Redis refuse SUBMIT whole when it is out of memory
(the user sees "busy" and nothing is half-written); the scripts that end or move jobs already admitted
carry ``allow-oom``, so a full Redis never strands a job.
"""
from __future__ import annotations

import redis

from worker.keys import Keys

# How long a group's past use of the workers counts against it when it waits again: its jobs' seconds in flight,
# halved every this many seconds. A client whose answer just ended is not a newcomer (see join_ring).
GROUP_USAGE_HALF_LIFE_S = 120
# How far a group's usage sets it back when it starts waiting: GROUP_USAGE_WEIGHT seconds per (decayed) second in
# flight, at most GROUP_USAGE_CAP_S. Uncapped, a user who had chatted a lot waited 195 s behind a stream of lighter
# attackers re-asking (a hostile audit, 2026-12-03); unweighted (1 s per second), attackers who had waited longer
# than their few seconds of usage stayed ahead of a visitor's second question for 5-7 s (the next audit).
GROUP_USAGE_WEIGHT = 4
GROUP_USAGE_CAP_S = 30

_ADMIT = "#!lua\n"  # refused as a whole when Redis is over maxmemory
_ALWAYS = "#!lua flags=allow-oom\n"  # finishing and moving admitted jobs must work even then

# Shared helpers, appended after the shebang of each script.
_COMMON = r"""
local N = cjson.decode(ARGV[1])
local HALF_LIFE, USAGE_WEIGHT, USAGE_CAP = """ + f"{GROUP_USAGE_HALF_LIFE_S}, {GROUP_USAGE_WEIGHT}, {GROUP_USAGE_CAP_S}" + r"""
local RING, SERVED, QUEUED, QUEUED_BY_USER, QUEUED_BY_GROUP = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local INFLIGHT_BY_GROUP, QUEUED_SINCE, INFLIGHT = KEYS[6], KEYS[7], KEYS[8]
local function uq(q) return N.uq .. q end
local function gq(g) return N.gq .. g end
local function xadd(job, etype, data, maxlen)
  return redis.call('XADD', N.stream .. job, 'MAXLEN', '~', maxlen, '*', 'type', etype, 'data', data)
end
local function hdecr(key, field)
  if tonumber(redis.call('HINCRBY', key, field, -1)) <= 0 then redis.call('HDEL', key, field) end
end
-- 1-based position of job in the order POP would serve the queue now: a walk over the two-level ring.
local function position(job, q)
  local idx = redis.call('LPOS', uq(q), job)
  if not idx then return false end
  local groups, inner, left, taken = redis.call('LRANGE', RING, 0, -1), {}, {}, 0
  local gi, n = 1, #groups
  for _, g in ipairs(groups) do
    inner[g] = {items = redis.call('LRANGE', gq(g), 0, -1), head = 1}
    for _, who in ipairs(inner[g].items) do left[who] = redis.call('LLEN', uq(who)) end
  end
  local pos = 0
  while gi <= n do
    local g = groups[gi]; gi = gi + 1
    local ring = inner[g]
    local who = ring.items[ring.head]; ring.head = ring.head + 1
    if who then
      pos = pos + 1
      if who == q then
        if taken == idx then return pos end
        taken = taken + 1
      end
      left[who] = left[who] - 1
      if left[who] > 0 then table.insert(ring.items, who) end
      if ring.head <= #ring.items then n = n + 1; groups[n] = g end
    end
  end
  return pos + 1
end
-- Server time in seconds: a group's usage is kept in one clock, whichever process runs the script.
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end
-- A group's decayed seconds in flight (N.usage holds "seconds:t" per group).
local function usage(g, now)
  local v = redis.call('HGET', N.usage, g)
  if not v then return 0 end
  local seconds, t = string.match(v, '^([^:]+):(.+)$')
  return tonumber(seconds) * 0.5 ^ ((now - tonumber(t)) / HALF_LIFE)
end
-- A job left flight for good (it ended): charge its group the time it held a slot.
local function charge_usage(group, job)
  local since = redis.call('HGET', N.job .. job, 'flight_t')
  if not since then return end
  local now = now_s()
  local total = usage(group, now) + math.max(0, now - tonumber(since))
  redis.call('HSET', N.usage, group, string.format('%.3f:%.3f', total, now))
  redis.call('EXPIRE', N.usage, math.floor(HALF_LIFE * 20))  -- after 20 half-lives nobody's use matters
end
-- 'served' holds groups with jobs in flight (or served this round): a group that starts waiting goes ahead
-- of all of them, in arrival order, so a light client never waits behind a round of a heavy client's jobs.
-- Among waiting groups, each waits with a key: the time it started waiting plus USAGE_WEIGHT times its decayed
-- seconds in flight (at most USAGE_CAP), and a group that starts waiting goes ahead of those with a later key.
-- So a client re-asking the moment its answer ended is not a newcomer (a hostile audit, 2026-12-03: sixty
-- addresses doing that kept a visitor 12-17 s behind them), and no group is set back by more than USAGE_CAP
-- seconds. A group with jobs in flight is served already: it goes behind every waiting group.
local function unmark_if_idle(qg)
  if redis.call('HEXISTS', INFLIGHT_BY_GROUP, qg) == 0 and redis.call('LLEN', gq(qg)) == 0 then
    redis.call('SREM', SERVED, qg)
  end
end
local function join_ring(qg)
  local ring = redis.call('LRANGE', RING, 0, -1)
  local now = now_s()
  -- compared as stored (rounded alike), so two groups arriving in the same millisecond keep arrival order
  local key = string.format('%.6f', now + math.min(USAGE_WEIGHT * usage(qg, now), USAGE_CAP))
  local mine = tonumber(key)
  local served = redis.call('SISMEMBER', SERVED, qg) == 1
  redis.call('HSET', N.ring_key, qg, key)
  for _, g in ipairs(ring) do
    local ahead = redis.call('SISMEMBER', SERVED, g) == 1
    if not ahead and not served then  -- a group without a key (requeued to the front) keeps its place
      ahead = tonumber(redis.call('HGET', N.ring_key, g) or '0') > mine
    end
    if ahead then
      redis.call('LINSERT', RING, 'BEFORE', g, qg)
      return
    end
  end
  redis.call('RPUSH', RING, qg)
end
local function leave_ring(qg)
  redis.call('LREM', RING, 0, qg)
  redis.call('HDEL', N.ring_key, qg)
end
local function left_flight(group, qg)
  hdecr(INFLIGHT_BY_GROUP, group)
  unmark_if_idle(qg)
end
local function unqueue(job, q, qg, user, group)
  if redis.call('LREM', uq(q), 1, job) > 0 then
    redis.call('DECR', QUEUED)
    hdecr(QUEUED_BY_USER, user)
    hdecr(QUEUED_BY_GROUP, group)
    if redis.call('LLEN', uq(q)) == 0 then
      redis.call('LREM', gq(qg), 0, q)
      if redis.call('LLEN', gq(qg)) == 0 then leave_ring(qg) end
      unmark_if_idle(qg)
    end
  end
  redis.call('ZREM', QUEUED_SINCE, job)
end
local function finish(job, etype, data, answer, stream_ttl, maxlen, holder, holder_ttl)
  local jk = N.job .. job
  local state = redis.call('HGET', jk, 'state')
  if state == 'done' or state == 'error' or state == 'cancelled' then return 0 end
  local f = redis.call('HMGET', jk, 'user', 'conv', 'worker', 'qkey', 'turn', 'group', 'qgroup')
  local user, group = f[1] or '', f[6] or f[1] or ''
  local q, qg = f[4] or user, f[7] or f[6] or f[4] or user
  if state == 'queued' then unqueue(job, q, qg, user, group) end
  if state == 'dispatched' or state == 'started' then
    charge_usage(group, job)
    left_flight(group, qg)
  end
  if f[2] then
    local ck = N.conv .. f[2]
    local tk = ck .. N.turns
    -- append only right after this job's own question: never twice, never after a truncate removed it
    local question = f[5] and redis.call('LINDEX', tk, tonumber(f[5]))
    if etype == 'done' and answer ~= '' and question and redis.call('LLEN', tk) == tonumber(f[5]) + 1
       and string.find(question, job, 1, true) then
      redis.call('RPUSH', tk, answer)
      if holder ~= '' then redis.call('SET', N.holder .. f[2], holder, 'EX', holder_ttl) end
    end
    if redis.call('HGET', ck, 'pending') == job then redis.call('HDEL', ck, 'pending') end
  end
  if f[3] then redis.call('SREM', N.running .. f[3], job) end
  redis.call('ZREM', INFLIGHT, job)
  redis.call('ZREM', QUEUED_SINCE, job)
  redis.call('DEL', N.cancel .. job)
  redis.call('HSET', jk, 'state', etype)
  redis.call('EXPIRE', jk, stream_ttl)
  xadd(job, etype, data, maxlen)
  redis.call('EXPIRE', N.stream .. job, stream_ttl)
  return 1
end
"""

# Admission and storage in one step: every check comes before the first write, so a refused turn creates
# nothing (no image, no conversation, no turn). KEYS[9..21]: job, stream, conv, turns, image, image quota of
# the identity, image quota of the group, submit rate of the group, text quota of the identity, of the group,
# bytes of images the whole service holds, the held images (zset key -> expiry), their sizes (hash key -> bytes).
# ARGV: names, job, user, qkey, group, qgroup, conv, new_conv ('1' = create it), payload, now, user_cap,
#   group_cap, global_cap, maxlen, ttl, turn_json ('' = raw job: no conversation), seconds_per_position ('' =
#   unknown), conv_ttl, image_bytes ('' = none), image_ttl, user_quota, group_quota, rate_max, rate_window_s,
#   text_user_quota, text_group_quota, text_window_s (text stored: the turn and the job's payload, in bytes),
#   answer_bytes (the answer's share of the text quota, reserved at its longest), total_image_quota (bytes of
#   images the whole service may hold at once; KEYS[19] counts them, KEYS[20..21] say when each goes)
# Returns {position} or {negative code} (see ``job_states.REFUSALS``).
SUBMIT = _ADMIT + _COMMON + r"""
local JK, SK, CK, TK, IK, QU, QG, RK = KEYS[9], KEYS[10], KEYS[11], KEYS[12], KEYS[13], KEYS[14], KEYS[15], KEYS[16]
local job, user, q, group, qg, conv, new_conv = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local payload, now = ARGV[9], ARGV[10]
local user_cap, group_cap, global_cap = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
local maxlen, ttl, turn, per_pos, conv_ttl = ARGV[14], ARGV[15], ARGV[16], ARGV[17], ARGV[18]
local image, image_ttl, user_quota, group_quota = ARGV[19], ARGV[20], tonumber(ARGV[21]), tonumber(ARGV[22])
local rate_max, rate_window = tonumber(ARGV[23]), ARGV[24]
local TU, TG = KEYS[17], KEYS[18]
local text_user_quota, text_group_quota, text_window = tonumber(ARGV[25]), tonumber(ARGV[26]), ARGV[27]
-- the answer is stored too (appended to the turns at FINISH): reserved at its longest here, as admission is the
-- only place a refusal costs nothing
local text_bytes = #payload + #turn + tonumber(ARGV[28])
if turn ~= '' then
  if new_conv == '1' then
    if redis.call('EXISTS', CK) == 1 then return {-3} end
  else
    if redis.call('HGET', CK, 'user') ~= user then return {-3} end
    local pending = redis.call('HGET', CK, 'pending')
    if pending then
      local st = redis.call('HGET', N.job .. pending, 'state')
      if st == 'queued' or st == 'dispatched' or st == 'started' then return {-4} end
    end
  end
end
if tonumber(redis.call('GET', RK) or '0') >= rate_max then return {-6} end
-- the caps count real identities and groups even in FIFO mode, where everyone shares one list
if tonumber(redis.call('HGET', QUEUED_BY_USER, user) or '0') >= user_cap then return {-1} end
local group_load = tonumber(redis.call('HGET', QUEUED_BY_GROUP, group) or '0')
                 + tonumber(redis.call('HGET', INFLIGHT_BY_GROUP, group) or '0')
if group_load >= group_cap then return {-5} end
if tonumber(redis.call('GET', QUEUED) or '0') >= global_cap then return {-2} end
-- Image bytes sent with a turn are charged to its identity and address whether or not the same bytes are stored
-- already, and checked against the service total either way: an answer that depended on whether the image
-- exists would tell a stranger whether anyone uploaded that picture.
local sent_image = image ~= ''
local new_image = sent_image and redis.call('EXISTS', IK) == 0
local QT, total_image_quota = KEYS[19], tonumber(ARGV[29])
-- The total is what is held now: images whose TTL has run out give their bytes back (a bounded batch a call; a
-- backlog only over-counts until later calls). A window of new bytes let images stored late in one window outlive
-- it (twice the total held), and a turn about an old image kept it alive past any window. Expiry times are Redis's
-- own clock, the one that expires the images (a UI replica's clock may be off).
local clock = redis.call('TIME')
local held_now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local HELD, SIZES, expires = KEYS[20], KEYS[21], held_now + tonumber(image_ttl)
local HOLDERS, OWNERS = KEYS[22], KEYS[23]
local function no_longer_held(key)  -- its bytes leave the total, and its sender's share
  local size = tonumber(redis.call('HGET', SIZES, key) or '0')
  redis.call('DECRBY', QT, size)
  local owner = redis.call('HGET', OWNERS, key)
  if owner then
    redis.call('ZREM', N.images_of .. owner, key)
    if tonumber(redis.call('ZINCRBY', HOLDERS, -size, owner)) <= 0 then redis.call('ZREM', HOLDERS, owner) end
    redis.call('HDEL', OWNERS, key)
  end
  redis.call('HDEL', SIZES, key)
  redis.call('ZREM', HELD, key)
  redis.call('DEL', N.picture_jobs .. key)
end
-- Whether a live job (queued, or on a worker that may be lost and queue it again) was admitted with this image:
-- such an image never gives way, or that job would fail "upload it again" for a flood of other people's pictures.
-- Members that ended are dropped as they are met.
local function needed(key)
  local jobs = N.picture_jobs .. key
  for _, other in ipairs(redis.call('SMEMBERS', jobs)) do
    local st = redis.call('HGET', N.job .. other, 'state')
    if st == 'queued' or st == 'dispatched' or st == 'started' then return true end
    redis.call('SREM', jobs, other)
  end
  return false
end
redis.call('PERSIST', QT)  -- the counter of an older Owlet was a window with a TTL
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', HELD, '-inf', held_now, 'LIMIT', 0, 256)) do
  no_longer_held(gone)
end
if tonumber(redis.call('GET', QT) or '0') < 0 then redis.call('SET', QT, 0) end
-- Past the total, pictures give way, at most 64 a call, never one a live job needs: a store filled by strangers
-- refused every new picture of everyone for a day. They go from the client group holding the most bytes, its least
-- recently used first (every turn about a picture renews it): with the least recently used of everyone going
-- first, 17 addresses at their quota emptied every idle chat's picture in 70 s (a hostile audit, 2026-12-03); now a
-- flood mostly evicts itself. Only when that finds nothing that may go (or for pictures stored before owners were
-- recorded) do they go by age alone, as before. What gives way is chosen here and removed only once the turn is
-- admitted.
local give_way, chosen = {}, {}
local function choose(key)
  table.insert(give_way, key)
  chosen[key] = true
  return tonumber(redis.call('HGET', SIZES, key) or '0')
end
if sent_image then
  if tonumber(redis.call('GET', QU) or '0') + #image > user_quota then return {-7} end
  if tonumber(redis.call('GET', QG) or '0') + #image > group_quota then return {-8} end
  local excess = tonumber(redis.call('GET', QT) or '0') + #image - total_image_quota
  local freed, seen, spent = {}, {}, {}  -- per group: bytes chosen, pictures looked at, nothing left to give
  local looks = 0
  while excess > 0 and looks < 64 do
    local largest, most = nil, 0
    local top = redis.call('ZREVRANGE', HOLDERS, 0, 15, 'WITHSCORES')
    for i = 1, #top, 2 do
      local holds = tonumber(top[i + 1]) - (freed[top[i]] or 0)
      if not spent[top[i]] and holds > most then largest, most = top[i], holds end
    end
    if not largest then break end
    local at = seen[largest] or 0
    local key = redis.call('ZRANGE', N.images_of .. largest, at, at)[1]
    looks, seen[largest] = looks + 1, at + 1
    if not key then
      spent[largest] = true
    elseif key ~= IK and not needed(key) then
      local size = choose(key)
      excess, freed[largest] = excess - size, (freed[largest] or 0) + size
    end
  end
  if excess > 0 then  -- and as a last resort (every large holder's pictures needed), by age alone as before
    for _, key in ipairs(redis.call('ZRANGE', HELD, 0, 63)) do
      if excess <= 0 then break end
      if key ~= IK and not chosen[key] and not needed(key) then
        excess = excess - choose(key)
      end
    end
  end
  if excess > 0 then return {-11} end
end
if tonumber(redis.call('GET', TU) or '0') + text_bytes > text_user_quota then return {-9} end
if tonumber(redis.call('GET', TG) or '0') + text_bytes > text_group_quota then return {-10} end
-- admitted: from here on, only writes
if redis.call('INCR', RK) == 1 then redis.call('EXPIRE', RK, rate_window) end
for _, tk in ipairs({TU, TG}) do  -- a fixed window from the first charge: a day's text, not a week of it
  if redis.call('INCRBY', tk, text_bytes) == text_bytes then redis.call('EXPIRE', tk, text_window) end
end
local charged = {}
if sent_image then charged = {QU, QG} end
if new_image then
  for _, key in ipairs(give_way) do
    no_longer_held(key)
    redis.call('DEL', key)
  end
  -- an entry left from when these bytes were stored before (expired, its purge still waiting) is given back first
  if redis.call('HEXISTS', SIZES, IK) == 1 then no_longer_held(IK) end
  redis.call('SET', IK, image, 'EX', image_ttl)
  redis.call('INCRBY', QT, #image)  -- the service total counts bytes held, once, until they go
  redis.call('ZADD', HELD, expires, IK)
  redis.call('HSET', SIZES, IK, #image)
  redis.call('HSET', OWNERS, IK, group)  -- the first to send it holds it (the charge is everyone's who sends it)
  redis.call('ZINCRBY', HOLDERS, #image, group)
  redis.call('ZADD', N.images_of .. group, expires, IK)
  redis.call('EXPIRE', N.images_of .. group, image_ttl)
elseif redis.call('EXISTS', IK) == 1 then  -- a turn about an image sent earlier keeps it alive
  redis.call('EXPIRE', IK, image_ttl)
  if redis.call('HEXISTS', SIZES, IK) == 0 then  -- held but not counted (purged early, or stored before the count)
    local size = redis.call('STRLEN', IK)
    redis.call('INCRBY', QT, size)
    redis.call('HSET', SIZES, IK, size)
  end
  redis.call('ZADD', HELD, expires, IK)
  local owner = redis.call('HGET', OWNERS, IK)
  if owner then
    redis.call('ZADD', N.images_of .. owner, expires, IK)
    redis.call('EXPIRE', N.images_of .. owner, image_ttl)
  end
end
if redis.call('EXISTS', IK) == 1 then  -- this job needs its image (sent now or earlier) until it ends
  redis.call('SADD', N.picture_jobs .. IK, job)
  redis.call('EXPIRE', N.picture_jobs .. IK, ttl)
end
for _, qk in ipairs(charged) do  -- a fixed window from the first charge, as for text: pushing the expiry out on
  -- every charge would count bytes since the last quiet day, and a busy service would never get its quota back
  if redis.call('INCRBY', qk, #image) == #image or redis.call('TTL', qk) < 0 then
    redis.call('EXPIRE', qk, image_ttl)
  end
end
if turn ~= '' then
  if new_conv == '1' then redis.call('HSET', CK, 'user', user, 'created', now) end
  redis.call('HSET', JK, 'turn', redis.call('RPUSH', TK, turn) - 1)
  redis.call('HSET', CK, 'pending', job)
  redis.call('EXPIRE', CK, conv_ttl)
  redis.call('EXPIRE', TK, conv_ttl)
end
redis.call('HSET', JK, 'payload', payload, 'user', user, 'qkey', q, 'group', group, 'qgroup', qg, 'conv', conv,
           'state', 'queued', 'enqueued_at', now, 'attempts', 0, 'dispatch_n', 0)
redis.call('EXPIRE', JK, ttl)
redis.call('HINCRBY', QUEUED_BY_USER, user, 1)
redis.call('HINCRBY', QUEUED_BY_GROUP, group, 1)
if redis.call('RPUSH', uq(q), job) == 1 then
  if redis.call('RPUSH', gq(qg), q) == 1 then join_ring(qg) end
end
redis.call('INCR', QUEUED)
redis.call('ZADD', QUEUED_SINCE, now, job)
local pos = position(job, q)
local eta = 'null'
if per_pos ~= '' then eta = string.format('%.1f', pos * tonumber(per_pos)) end
xadd(job, 'queued', '{"position": ' .. pos .. ', "eta_s": ' .. eta .. ', "t": ' .. now .. '}', maxlen)
redis.call('EXPIRE', SK, ttl)
return {pos}
"""

# ARGV: names, capacity, now, shared. Returns {job, dispatch_n, conv} or nil when nothing waits or no slot is free.
# The first `shared` slots (the workers' decode rows) go round robin; the slots beyond them only to groups with
# nothing in flight, so a newcomer's question reaches an engine, whose time slicing then gives it a row, however
# many long answers the groups already served keep in flight.
POP = _ALWAYS + _COMMON + r"""
local capacity, now, shared = tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
local inflight = redis.call('ZCARD', INFLIGHT)
if inflight >= capacity then return nil end
local newcomers_only = inflight >= shared
while true do
  local qg
  if newcomers_only then
    for _, g in ipairs(redis.call('LRANGE', RING, 0, -1)) do
      if redis.call('HEXISTS', INFLIGHT_BY_GROUP, g) == 0 then qg = g; break end
    end
    if qg then redis.call('LREM', RING, 1, qg) end
  else
    qg = redis.call('LPOP', RING)
  end
  if not qg then return nil end
  redis.call('HDEL', N.ring_key, qg)  -- served now: behind every waiting group from here on
  local q = redis.call('LPOP', gq(qg))
  local job = q and redis.call('LPOP', uq(q))
  if q and redis.call('LLEN', uq(q)) > 0 then redis.call('RPUSH', gq(qg), q) end
  if redis.call('LLEN', gq(qg)) > 0 then redis.call('RPUSH', RING, qg) end
  if job then
    redis.call('DECR', QUEUED)
    redis.call('ZREM', QUEUED_SINCE, job)
    local jk = N.job .. job
    local f = redis.call('HMGET', jk, 'user', 'group')
    if f[1] then hdecr(QUEUED_BY_USER, f[1]) end
    local group = f[2] or f[1]
    if group then hdecr(QUEUED_BY_GROUP, group) end
    if redis.call('HGET', jk, 'state') == 'queued' then
      redis.call('HINCRBY', INFLIGHT_BY_GROUP, group, 1)
      redis.call('SADD', SERVED, qg)
      local n = redis.call('HINCRBY', jk, 'dispatch_n', 1)
      redis.call('HINCRBY', jk, 'attempts', 1)
      redis.call('HSET', jk, 'state', 'dispatched', 'dispatched_at', now, 'target', '', 'flight_t', now_s())
      redis.call('ZADD', INFLIGHT, now, job)
      return {job, n, redis.call('HGET', jk, 'conv') or ''}
    end
  end
end
"""

# ARGV: names, job, dispatch_n, worker, now, maxlen. 1 = this worker now owns the job; 0 = stale or duplicate.
CLAIM = _ALWAYS + _COMMON + r"""
local job, n, worker, now, maxlen = ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local jk = N.job .. job
if redis.call('HGET', jk, 'state') ~= 'dispatched' or redis.call('HGET', jk, 'dispatch_n') ~= n then return 0 end
redis.call('HSET', jk, 'state', 'started', 'worker', worker, 'started_at', now)
redis.call('SADD', N.running .. worker, job)
xadd(job, 'started', '{"worker": "' .. worker .. '", "t": ' .. now .. '}', maxlen)
return 1
"""

# ARGV: names, job, type, data_json, answer_turn_json ('' = none), stream_ttl, maxlen, holder_worker ('' = none),
#   only_state ('' = any non-terminal state), only_worker ('' = any), holder_ttl: a runner only ends the job it
#   still owns.
FINISH = _ALWAYS + _COMMON + r"""
local jk = N.job .. ARGV[2]
if ARGV[9] ~= '' and redis.call('HGET', jk, 'state') ~= ARGV[9] then return 0 end
if ARGV[10] ~= '' and redis.call('HGET', jk, 'worker') ~= ARGV[10] then return 0 end
return finish(ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[11])
"""

# Worker lost: put a dispatched/started job back at the front of its identity's queue (and its identity and
# group at the front of their rings), or fail it once max_attempts dispatches were spent, or end it cancelled
# if its user stopped it meanwhile.
# ARGV: names, job, max_attempts, now, maxlen, stream_ttl, error_json
REQUEUE = _ALWAYS + _COMMON + r"""
local job, max_attempts, now, maxlen, ttl, err = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6], ARGV[7]
local jk = N.job .. job
local state = redis.call('HGET', jk, 'state')
if state ~= 'dispatched' and state ~= 'started' then return 0 end
if redis.call('EXISTS', N.cancel .. job) == 1 then
  finish(job, 'cancelled', '{"t": ' .. now .. '}', '', ttl, maxlen, '', 0)
  return 3
end
if tonumber(redis.call('HGET', jk, 'attempts') or '0') >= max_attempts then
  finish(job, 'error', err, '', ttl, maxlen, '', 0)
  return 2
end
local f = redis.call('HMGET', jk, 'user', 'worker', 'qkey', 'group', 'qgroup')
local user = f[1] or ''
local q, group = f[3] or user, f[4] or user
local qg = f[5] or group
if f[2] then redis.call('SREM', N.running .. f[2], job) end
redis.call('ZREM', INFLIGHT, job)
redis.call('HSET', jk, 'state', 'queued', 'worker', '', 'target', '')
left_flight(group, qg)
if redis.call('LPUSH', uq(q), job) == 1 then
  if redis.call('LPUSH', gq(qg), q) == 1 then
    redis.call('LPUSH', RING, qg)
    redis.call('HDEL', N.ring_key, qg)  -- at the front, with no key: nobody overtakes a requeued job
  end
end
redis.call('INCR', QUEUED)
redis.call('HINCRBY', QUEUED_BY_USER, user, 1)
redis.call('HINCRBY', QUEUED_BY_GROUP, group, 1)
redis.call('ZADD', QUEUED_SINCE, now, job)
local pos = position(job, q) or 1
xadd(job, 'queued', '{"position": ' .. pos .. ', "restart": true, "t": ' .. now .. '}', maxlen)
return 1
"""

# ARGV: names, job. Returns the 1-based position or nil.
POSITION = "#!lua flags=no-writes,allow-oom\n" + _COMMON + r"""
local jk = N.job .. ARGV[2]
if redis.call('HGET', jk, 'state') ~= 'queued' then return nil end
local q = redis.call('HGET', jk, 'qkey')
return position(ARGV[2], q) or nil
"""


class Scripts:
    """The registered scripts, bound to one Redis client and one ``Keys``."""

    def __init__(self, r: redis.Redis, keys: Keys):
        self.keys = keys
        self._fixed_keys = keys.script_keys()
        self._names = keys.script_names()
        self.submit = r.register_script(SUBMIT)
        self.pop = r.register_script(POP)
        self.claim = r.register_script(CLAIM)
        self.finish = r.register_script(FINISH)
        self.requeue = r.register_script(REQUEUE)
        self.position = r.register_script(POSITION)

    def call(self, script, *args, extra_keys: list[str] = ()):
        return script(keys=[*self._fixed_keys, *extra_keys], args=[self._names, *args])
