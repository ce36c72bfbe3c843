-- Helpers every script shares. The loader (worker.queue.scripts) puts this file after the script's shebang line
-- and a prelude it writes from worker.keys and worker.queue.fairness: the tables KEY (key names and prefixes),
-- JOB, CONV and SLOTS (hash fields), STATE (a job's states) and ENTRY (a stream entry's fields), TURNS_SUFFIX, and
-- the values HALF_LIFE, USAGE_WEIGHT and USAGE_CAP. The script's own body comes after it.

-- The script's named arguments: one JSON object (each script's header lists its fields; every script also gets
-- the deployment's key prefix as `prefix`).
local args = cjson.decode(ARGV[1])
-- KEY's names come without the key prefix, so the scripts' text, and Redis's cache of it, is the same whatever the
-- prefix: put it in front of each.
for name, key in pairs(KEY) do KEY[name] = args.prefix .. key end
local function uq(q) return KEY.user_queue .. q end
local function gq(g) return KEY.group_queue .. g end
local function xadd(job, etype, data, maxlen)
  return redis.call('XADD', KEY.stream .. job, 'MAXLEN', '~', maxlen, '*', ENTRY.type, etype, ENTRY.data, data)
end
local function hdecr(key, field)
  if tonumber(redis.call('HINCRBY', key, field, -1)) <= 0 then redis.call('HDEL', key, field) end
end
-- Server time in seconds: a group's usage is kept in one clock, whichever process runs the script.
local function now_s()
  local t = redis.call('TIME')
  return tonumber(t[1]) + tonumber(t[2]) / 1e6
end
-- A group's decayed seconds in flight (KEY.group_usage holds "seconds:t" per group).
local function usage(g, now)
  local v = redis.call('HGET', KEY.group_usage, g)
  if not v then return 0 end
  local seconds, t = string.match(v, '^([^:]+):(.+)$')
  return tonumber(seconds) * 0.5 ^ ((now - tonumber(t)) / HALF_LIFE)
end
-- 1-based place of job in the round-robin walk over the two-level ring: the order POP serves the shared slots.
local function walk_position(job, q, idx)
  local groups, inner, left, taken = redis.call('LRANGE', KEY.ring, 0, -1), {}, {}, 0
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
-- The next job of a group with nothing in flight may also take a slot POP keeps for such groups, or one it keeps
-- for light groups (KEY.slots: the slot layout of the last POP). Its place among the groups competing for those
-- slots, or nil when it competes for none.
-- The waiting groups with nothing in flight that POP's light slots serve, in the order it serves them: least
-- (decayed) usage first, then ring order. Returns a list of {group, usage}.
local function light_order(clock)
  local order, place = {}, 0
  for _, g in ipairs(redis.call('LRANGE', KEY.ring, 0, -1)) do
    place = place + 1
    if redis.call('HEXISTS', KEY.inflight_by_group, g) == 0 then
      local used = usage(g, clock)
      if USAGE_WEIGHT * used <= USAGE_CAP then table.insert(order, {g, used, place}) end
    end
  end
  table.sort(order, function(a, b) return a[2] < b[2] or (a[2] == b[2] and a[3] < b[3]) end)
  return order
end
local function least_used_light_group(clock)
  local first = light_order(clock)[1]
  return first and first[1]
end
local function slot_position(job, q, idx)
  local layout = redis.call('HMGET', KEY.slots, SLOTS.capacity, SLOTS.shared, SLOTS.light_from)
  local capacity, shared, light_from = tonumber(layout[1]), tonumber(layout[2]), tonumber(layout[3])
  local mine = redis.call('HGET', KEY.job .. job, JOB.qgroup)
  if not capacity or capacity <= shared or idx ~= 0 or not mine or redis.call('LINDEX', gq(mine), 0) ~= q
     or redis.call('HEXISTS', KEY.inflight_by_group, mine) == 1 then
    return nil
  end
  local eligible_ahead = 0
  for _, g in ipairs(redis.call('LRANGE', KEY.ring, 0, -1)) do
    if g == mine then break end
    if redis.call('HEXISTS', KEY.inflight_by_group, g) == 0 then eligible_ahead = eligible_ahead + 1 end
  end
  if capacity > light_from then
    for place, entry in ipairs(light_order(now_s())) do
      if entry[1] == mine then return math.min(place, eligible_ahead + 1) end
    end
  end
  return eligible_ahead + 1
end
-- 1-based position of job in the order the queue will serve it now: its place in the round-robin walk, or among
-- the groups competing for the slots kept for groups with nothing in flight, whichever comes first.
local function position(job, q)
  local idx = redis.call('LPOS', uq(q), job)
  if not idx then return false end
  local walked = walk_position(job, q, idx)
  return math.min(walked, slot_position(job, q, idx) or walked)
end
-- A job left flight for good (it ended): charge its group the time it held a slot.
local function charge_usage(group, job)
  local since = redis.call('HGET', KEY.job .. job, JOB.flight_t)
  if not since then return end
  local now = now_s()
  local total = usage(group, now) + math.max(0, now - tonumber(since))
  redis.call('HSET', KEY.group_usage, group, string.format('%.3f:%.3f', total, now))
  redis.call('EXPIRE', KEY.group_usage, math.floor(HALF_LIFE * 20))  -- after 20 half-lives nobody's use matters
end
-- KEY.served holds groups with jobs in flight (or served this round): a group that starts waiting goes ahead
-- of all of them, in arrival order, so a light client never waits behind a round of a heavy client's jobs.
-- Among waiting groups, each waits with a key: the time it started waiting plus a setback of USAGE_WEIGHT times
-- its decayed seconds in flight, at most USAGE_CAP or the longest time a waiting group has waited now, whichever is
-- larger. A group that starts waiting goes ahead of those with a later key. So a client re-asking the moment its
-- answer ended is not a newcomer, a newcomer goes ahead of everyone who used the workers lately however long the
-- line is, and a group that used them a lot queues at worst behind the whole line waiting now, never behind a
-- stream of later arrivals. A group with jobs in flight is served already: it goes behind every waiting group.
local function unmark_if_idle(qg)
  if redis.call('HEXISTS', KEY.inflight_by_group, qg) == 0 and redis.call('LLEN', gq(qg)) == 0 then
    redis.call('SREM', KEY.served, qg)
  end
end
local function setback(qg, now)
  local weighted = USAGE_WEIGHT * usage(qg, now)
  if weighted <= USAGE_CAP then return weighted end
  local longest = USAGE_CAP  -- ring_since holds exactly the waiting groups that joined with a key
  for _, since in ipairs(redis.call('HVALS', KEY.ring_since)) do longest = math.max(longest, now - tonumber(since)) end
  return math.min(weighted, longest)
end
local function join_ring(qg)
  local ring = redis.call('LRANGE', KEY.ring, 0, -1)
  local now = now_s()
  -- compared as stored (rounded alike), so two groups arriving in the same millisecond keep arrival order
  local key = string.format('%.6f', now + setback(qg, now))
  local mine = tonumber(key)
  local served = redis.call('SISMEMBER', KEY.served, qg) == 1
  redis.call('HSET', KEY.ring_keys, qg, key)
  redis.call('HSET', KEY.ring_since, qg, string.format('%.6f', now))
  for _, g in ipairs(ring) do
    local ahead = redis.call('SISMEMBER', KEY.served, g) == 1
    if not ahead and not served then  -- a group without a key (requeued to the front) keeps its place
      ahead = tonumber(redis.call('HGET', KEY.ring_keys, g) or '0') > mine
    end
    if ahead then
      redis.call('LINSERT', KEY.ring, 'BEFORE', g, qg)
      return
    end
  end
  redis.call('RPUSH', KEY.ring, qg)
end
local function forget_key(qg)
  redis.call('HDEL', KEY.ring_keys, qg)
  redis.call('HDEL', KEY.ring_since, qg)
end
local function leave_ring(qg)
  redis.call('LREM', KEY.ring, 0, qg)
  forget_key(qg)
end
local function left_flight(group, qg)
  hdecr(KEY.inflight_by_group, group)
  unmark_if_idle(qg)
end
local function unqueue(job, q, qg, user, group)
  if redis.call('LREM', uq(q), 1, job) > 0 then
    redis.call('DECR', KEY.queued_count)
    hdecr(KEY.queued_by_user, user)
    hdecr(KEY.queued_by_group, group)
    if redis.call('LLEN', uq(q)) == 0 then
      redis.call('LREM', gq(qg), 0, q)
      if redis.call('LLEN', gq(qg)) == 0 then leave_ring(qg) end
      unmark_if_idle(qg)
    end
  end
  redis.call('ZREM', KEY.queued_since, job)
end
-- Stored pictures (SUBMIT, MAKE_ROOM). A picture no longer held: its bytes leave the service total, and its
-- sender's share.
local function no_longer_held(key)
  local size = tonumber(redis.call('HGET', KEY.image_sizes, key) or '0')
  redis.call('DECRBY', KEY.total_image_quota, size)
  local owner = redis.call('HGET', KEY.image_owners, key)
  if owner then
    redis.call('ZREM', KEY.images_of .. owner, key)
    if tonumber(redis.call('ZINCRBY', KEY.image_holders, -size, owner)) <= 0 then
      redis.call('ZREM', KEY.image_holders, owner)
    end
    redis.call('HDEL', KEY.image_owners, key)
  end
  redis.call('HDEL', KEY.image_sizes, key)
  redis.call('ZREM', KEY.images_held, key)
  redis.call('DEL', KEY.picture_jobs .. key)
end
-- Whether a live job (queued, or on a worker that may be lost and queue it again) was admitted with this image:
-- such an image never gives way, or that job would fail "upload it again" for a flood of other people's pictures.
-- Members that ended are dropped as they are met.
local function needed(key)
  local jobs = KEY.picture_jobs .. key
  for _, other in ipairs(redis.call('SMEMBERS', jobs)) do
    local st = redis.call('HGET', KEY.job .. other, JOB.state)
    if st == STATE.queued or st == STATE.dispatched or st == STATE.started then return true end
    redis.call('SREM', jobs, other)
  end
  return false
end

-- The service-wide history budget (docs/redis_memory.md). Every conversation SUBMIT stores is charged the bytes
-- worker.memory_model says it takes (CONV_BYTES, TURN_BYTES, INDEX_BYTES: the prelude's), in
-- KEY.conversation_sizes and their sum KEY.history_total; KEY.conversations_held orders them by when they expire,
-- which is least recently used first, as each turn renews the TTL. Past the budget, the least recently used give
-- way whole, and leave their owner a notice (CLEARED_BYTES, charged as well).
local function conversation_live(conv)  -- a job still answering it: it never gives way then
  local pending = redis.call('HGET', KEY.conv .. conv, CONV.pending)
  if not pending then return false end
  local st = redis.call('HGET', KEY.job .. pending, JOB.state)
  return st == STATE.queued or st == STATE.dispatched or st == STATE.started
end
local function history_charge(conv, delta)  -- while conv is charged at all
  if delta ~= 0 and redis.call('HEXISTS', KEY.conversation_sizes, conv) == 1 then
    redis.call('HINCRBY', KEY.conversation_sizes, conv, delta)
    redis.call('INCRBY', KEY.history_total, delta)
  end
end
local function uncharge(conv)  -- conv leaves the budget (gone, or about to be)
  local size = tonumber(redis.call('HGET', KEY.conversation_sizes, conv) or '0')
  redis.call('DECRBY', KEY.history_total, size)
  redis.call('HDEL', KEY.conversation_sizes, conv)
  redis.call('ZREM', KEY.conversations_held, conv)
  return size
end
-- Conversations and notices whose TTL ran out give their bytes back (a bounded batch a call, as for pictures).
local function history_expired(now)
  for _, conv in ipairs(redis.call('ZRANGEBYSCORE', KEY.conversations_held, '-inf', now, 'LIMIT', 0, 256)) do
    uncharge(conv)
  end
  local gone = redis.call('ZRANGEBYSCORE', KEY.cleared_held, '-inf', now, 'LIMIT', 0, 256)
  for _, conv in ipairs(gone) do redis.call('ZREM', KEY.cleared_held, conv) end
  if #gone > 0 then redis.call('DECRBY', KEY.history_total, #gone * CLEARED_BYTES) end
  if tonumber(redis.call('GET', KEY.history_total) or '0') < 0 then redis.call('SET', KEY.history_total, 0) end
end
-- Every key of a conversation goes at once: its hash and turns, the API's index entries naming it, the worker
-- holding its cache, its owner's newest-conversation pointer while it names it, and its ended jobs' hashes and
-- streams (named in its questions' turns). Its owner gets a notice, kept as long as the conversation would have
-- been. Returns the bytes given back to the budget.
local function clear_conversation(conv, now)
  local expires = tonumber(redis.call('ZSCORE', KEY.conversations_held, conv) or now)
  local ttl = math.max(1, math.ceil(expires - now))
  local ck = KEY.conv .. conv
  local tk = ck .. TURNS_SUFFIX
  local owner = redis.call('HGET', ck, CONV.user)
  for _, t in ipairs(redis.call('LRANGE', tk, 0, -1)) do
    -- job_id is a turn's last field (worker.history.turn_json); a quote in the text is escaped, so never matches
    local job = string.match(t, '"job_id": *"(%x+)"}$')
    if job and redis.call('HGET', KEY.job .. job, JOB.user) == owner then
      local st = redis.call('HGET', KEY.job .. job, JOB.state)
      if st ~= STATE.queued and st ~= STATE.dispatched and st ~= STATE.started then
        redis.call('DEL', KEY.job .. job, KEY.stream .. job, KEY.cancel .. job)
      end
    end
  end
  local ik = KEY.chat_indexes_of .. conv
  for _, entry in ipairs(redis.call('SMEMBERS', ik)) do
    if redis.call('GET', entry) == conv then redis.call('DEL', entry) end
  end
  redis.call('DEL', ck, tk, ik, KEY.holder .. conv)
  local size = uncharge(conv)
  if owner then
    if redis.call('GET', KEY.newest .. owner) == conv then redis.call('DEL', KEY.newest .. owner) end
    redis.call('SET', KEY.cleared .. conv, owner, 'EX', ttl)
    redis.call('ZADD', KEY.cleared_held, expires, conv)
    redis.call('INCRBY', KEY.history_total, CLEARED_BYTES)
    size = size - CLEARED_BYTES
  end
  return size
end
-- The oldest notice goes (its owner is then told only that the conversation does not exist).
local function drop_notice(conv)
  redis.call('DEL', KEY.cleared .. conv)
  redis.call('ZREM', KEY.cleared_held, conv)
  redis.call('DECRBY', KEY.history_total, CLEARED_BYTES)
end
-- Choose what gives way for `excess` bytes, least recently used first, never `keep` nor a conversation a job is
-- answering: at most `looks` conversations looked at, then the oldest notices. Returns the conversations and the
-- notices chosen, and the excess left (> 0: not enough could give way).
local function choose_history(excess, keep, looks)
  local convs, notices = {}, {}
  if excess <= 0 then return convs, notices, excess end
  for _, conv in ipairs(redis.call('ZRANGE', KEY.conversations_held, 0, looks - 1)) do
    if excess <= 0 then break end
    if conv ~= keep and not conversation_live(conv) then
      table.insert(convs, conv)
      local size = tonumber(redis.call('HGET', KEY.conversation_sizes, conv) or '0')
      excess = excess - size + CLEARED_BYTES
    end
  end
  if excess > 0 then
    for _, conv in ipairs(redis.call('ZRANGE', KEY.cleared_held, 0, looks - 1)) do
      if excess <= 0 then break end
      table.insert(notices, conv)
      excess = excess - CLEARED_BYTES
    end
  end
  return convs, notices, excess
end
-- dispatched -> started on `worker` (CLAIM, and POP when a worker takes its next job itself), and what the worker
-- reads to start it, so it needs no further round trip: {payload, group, cancelled (0/1), conv, conv's owner}
-- ('' for what is missing).
local function start_job(job, worker, now, maxlen)
  local jk = KEY.job .. job
  redis.call('HSET', jk, JOB.state, STATE.started, JOB.worker, worker, JOB.started_at, now)
  redis.call('SADD', KEY.running .. worker, job)
  xadd(job, STATE.started, '{"worker": "' .. worker .. '", "t": ' .. now .. '}', maxlen)
  local f = redis.call('HMGET', jk, JOB.payload, JOB.group, JOB.conv)
  local owner = f[3] and redis.call('HGET', KEY.conv .. f[3], CONV.user)
  return {f[1] or '', f[2] or '', redis.call('EXISTS', KEY.cancel .. job), f[3] or '', owner or ''}
end
local function finish(job, etype, data, answer, stream_ttl, maxlen, holder, holder_ttl)
  local jk = KEY.job .. job
  local state = redis.call('HGET', jk, JOB.state)
  if state == STATE.done or state == STATE.error or state == STATE.cancelled then return 0 end
  local f = redis.call('HMGET', jk, JOB.user, JOB.conv, JOB.worker, JOB.qkey, JOB.turn, JOB.group, JOB.qgroup)
  local user, group = f[1] or '', f[6] or f[1] or ''
  local q, qg = f[4] or user, f[7] or f[6] or f[4] or user
  if state == STATE.queued then unqueue(job, q, qg, user, group) end
  if state == STATE.dispatched or state == STATE.started then
    charge_usage(group, job)
    left_flight(group, qg)
  end
  if f[2] then
    local ck = KEY.conv .. f[2]
    local tk = ck .. TURNS_SUFFIX
    -- append only right after this job's own question: never twice, never after a truncate removed it
    local question = f[5] and redis.call('LINDEX', tk, tonumber(f[5]))
    local appended = false
    if etype == STATE.done and answer ~= '' and question and redis.call('LLEN', tk) == tonumber(f[5]) + 1
       and string.find(question, job, 1, true) then
      redis.call('RPUSH', tk, answer)
      appended = true
      if holder ~= '' then redis.call('SET', KEY.holder .. f[2], holder, 'EX', holder_ttl) end
    end
    if redis.call('HGET', ck, CONV.pending) == job then redis.call('HDEL', ck, CONV.pending) end
    -- the answer's bytes were charged to the history budget at their longest: charge what it stored instead
    local reserved = tonumber(redis.call('HGET', jk, JOB.reserved) or '0')
    if reserved > 0 then history_charge(f[2], (appended and #answer + TURN_BYTES or 0) - reserved) end
  end
  if f[3] then redis.call('SREM', KEY.running .. f[3], job) end
  redis.call('ZREM', KEY.inflight, job)
  redis.call('ZREM', KEY.queued_since, job)
  redis.call('DEL', KEY.cancel .. job)
  redis.call('HSET', jk, JOB.state, etype)
  redis.call('EXPIRE', jk, stream_ttl)
  xadd(job, etype, data, maxlen)
  redis.call('EXPIRE', KEY.stream .. job, stream_ttl)
  return 1
end
-- POP's step (pop.lua describes it), shared with FINISH, which takes a worker's next job in the slot its job freed.
local function pop_next(capacity, shared, light_from, now, worker, maxlen)
  -- A worker taking its next job first starts the oldest job already dispatched to Celery for any worker (or for
  -- it) that no worker has claimed yet: it was popped earlier, so it must not start later than the jobs popped after
  -- it, which a taking worker would otherwise start at once while it still travels through Celery. Its Celery
  -- message then fails CLAIM (not dispatched any more) and is dropped. It is in flight already: no slot is used.
  if worker then
    for _, j in ipairs(redis.call('ZRANGE', KEY.inflight, 0, -1)) do
      local f = redis.call('HMGET', KEY.job .. j, JOB.state, JOB.target, JOB.dispatch_n, JOB.conv)
      if f[1] == STATE.dispatched and (not f[2] or f[2] == '' or f[2] == worker) then
        redis.call('HSET', KEY.job .. j, JOB.target, worker)
        local s = start_job(j, worker, now, maxlen)
        return {j, tonumber(f[3]), f[4] or '', 1, s[1], s[2], s[3], s[4], s[5], 0}
      end
    end
  end
  local inflight = redis.call('ZCARD', KEY.inflight)
  if inflight >= capacity then return nil end
  local newcomers_only, light_only = inflight >= shared, inflight >= light_from
  -- the slot layout position() reads (POSITION, and the queued event of SUBMIT and REQUEUE)
  redis.call('HSET', KEY.slots, SLOTS.capacity, capacity, SLOTS.shared, shared, SLOTS.light_from, light_from)
  local clock = newcomers_only and now_s()
  while true do
    local qg
    if light_only then
      qg = least_used_light_group(clock)
      if qg then redis.call('LREM', KEY.ring, 1, qg) end
    elseif newcomers_only then
      for _, g in ipairs(redis.call('LRANGE', KEY.ring, 0, -1)) do
        if redis.call('HEXISTS', KEY.inflight_by_group, g) == 0 then
          qg = g
          break
        end
      end
      if qg then redis.call('LREM', KEY.ring, 1, qg) end
    else
      qg = redis.call('LPOP', KEY.ring)
    end
    if not qg then return nil end
    forget_key(qg)  -- served now: behind every waiting group from here on
    local q = redis.call('LPOP', gq(qg))
    local job = q and redis.call('LPOP', uq(q))
    if q and redis.call('LLEN', uq(q)) > 0 then redis.call('RPUSH', gq(qg), q) end
    if redis.call('LLEN', gq(qg)) > 0 then redis.call('RPUSH', KEY.ring, qg) end
    if job then
      redis.call('DECR', KEY.queued_count)
      redis.call('ZREM', KEY.queued_since, job)
      local jk = KEY.job .. job
      local f = redis.call('HMGET', jk, JOB.user, JOB.group)
      if f[1] then hdecr(KEY.queued_by_user, f[1]) end
      local group = f[2] or f[1]
      if group then hdecr(KEY.queued_by_group, group) end
      if redis.call('HGET', jk, JOB.state) == STATE.queued then
        redis.call('HINCRBY', KEY.inflight_by_group, group, 1)
        redis.call('SADD', KEY.served, qg)
        local n = redis.call('HINCRBY', jk, JOB.dispatch_n, 1)
        redis.call('HINCRBY', jk, JOB.attempts, 1)
        redis.call('HSET', jk, JOB.state, STATE.dispatched, JOB.dispatched_at, now, JOB.target, '', JOB.flight_t, now_s())
        redis.call('ZADD', KEY.inflight, now, job)
        local conv = redis.call('HGET', jk, JOB.conv) or ''
        if worker then
          local holder = conv ~= '' and redis.call('GET', KEY.holder .. conv)
          if not holder or holder == worker then
            redis.call('HSET', jk, JOB.target, worker)
            local s = start_job(job, worker, now, maxlen)
            return {job, n, conv, 1, s[1], s[2], s[3], s[4], s[5], holder and 1 or 0}
          end
        end
        return {job, n, conv}
      end
    end
  end
end
