-- The budgets SUBMIT enforces and MAKE_ROOM restores: the pictures Redis holds (their service total, and who
-- holds the most), and the service-wide history budget (docs/redis_memory.md).

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
-- FINISH takes each job out as it ends, so a member is live but for jobs whose hash expired unfinished (or ended
-- under an earlier version, which left them): a few members are read, those that ended dropped as they are met,
-- and an image with more such members than NEEDED_LOOKS counts as needed this time (later calls drop the rest). A
-- picture a crowd asks about (an example's) has as many members as live jobs: reading them all was a scan of
-- the crowd in the call.
local NEEDED_LOOKS = 16
local function needed(key)
  local jobs = KEY.picture_jobs .. key
  local looked = redis.call('SRANDMEMBER', jobs, NEEDED_LOOKS)
  for _, other in ipairs(looked) do
    local st = redis.call('HGET', KEY.job .. other, JOB.state)
    if st == STATE.queued or st == STATE.dispatched or st == STATE.started then return true end
    redis.call('SREM', jobs, other)
  end
  return #looked == NEEDED_LOOKS and redis.call('EXISTS', jobs) == 1
end

-- The service-wide history budget (docs/redis_memory.md). Every conversation SUBMIT stores is charged the bytes
-- worker.store.memory_model says it takes (CONV_BYTES, TURN_BYTES, INDEX_BYTES: the prelude's), in
-- KEY.conversation_sizes and their sum KEY.history_total; KEY.conversations_held orders them by when they expire,
-- which is least recently used first, as each turn renews the TTL. Past the budget, the least recently used give
-- way whole, and leave their owner a notice (CLEARED_BYTES, charged as well).

-- What a conversation holding `turns` (their JSON) and `entries` API index entries is charged.
local function conversation_bytes(turns, entries)
  local size = CONV_BYTES + entries * INDEX_BYTES
  for _, t in ipairs(turns) do size = size + #t + TURN_BYTES end
  return size
end
-- What the history limits count (the settings history_max_turns, history_max_chars and max_images_per_request): a
-- turn's characters (code points, as Python counts a str) and whether it names a picture, from its stored JSON. A
-- conversation keeps its sums in its hash (CONV.chars, CONV.images: SUBMIT, FINISH and TRUNCATE keep them exact),
-- so a follow-up is checked without reading its turns.
local function turn_measure(turn)
  local t = cjson.decode(turn)
  local text = type(t.text) == 'string' and t.text or ''
  local _, chars = string.gsub(text, '[^\128-\191]', '')  -- a UTF-8 character's bytes but its first are 10xxxxxx
  return chars, type(t.image_sha) == 'string' and 1 or 0
end
local function turns_measure(turns)
  local chars, images = 0, 0
  for _, turn in ipairs(turns) do
    local c, i = turn_measure(turn)
    chars, images = chars + c, images + i
  end
  return chars, images
end
-- A job still answering conv (it never gives way then): that job's id, else false.
local function conversation_live(conv)
  local pending = redis.call('HGET', KEY.conv .. conv, CONV.pending)
  if not pending then return false end
  local st = redis.call('HGET', KEY.job .. pending, JOB.state)
  return (st == STATE.queued or st == STATE.dispatched or st == STATE.started) and pending
end
local function history_charge(conv, delta)  -- while conv is charged at all
  if delta == 0 then return end
  -- a charge is never 0 (CONV_BYTES at least), so a field that comes out as the delta itself was not there
  if redis.call('HINCRBY', KEY.conversation_sizes, conv, delta) == delta then
    redis.call('HDEL', KEY.conversation_sizes, conv)
  else
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
    -- job_id is a turn's last field (worker.store.history.turn_json); a quote in the text is escaped, so never matches
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
