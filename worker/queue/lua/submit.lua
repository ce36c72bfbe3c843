#!lua
-- SUBMIT: (new) -> queued. Admission and storage in one step: every check comes before the first write, so a
-- refused turn creates nothing (no image, no conversation, no turn). Without the allow-oom flag, Redis refuses the
-- whole script when it is over maxmemory: the user is told the service is busy, and nothing is half-written.
--
-- args: job, user, group, conv: the job's id, identity, client group and conversation
--   queue_user, queue_group: the queue and ring entry it waits in (its user and group; in FIFO mode shared ones)
--   new_conv: create the conversation (refused if it exists) rather than continue it (refused unless the user's)
--   payload: the job as JSON; now: the caller's clock, as text (stored, and written into the queued event as is)
--   turn: the question's turn as JSON ('' = a job without a conversation turn); turn_chars, turn_images: its text's
--   characters and whether it names a picture, as the history limits count them (budgets.lua turn_measure)
--   history: turns as JSON written before the question's in a new conversation (a stateless client's earlier
--   messages; absent = none)
--   expect_turns: continue the conversation only while it holds exactly this many turns (absent = any), else
--   refused as busy: a stateless client matched its earlier messages to those turns, which must not have changed
--   (the history limits, history_max_turns, history_max_chars and max_images_per_request, are checked here, on the
--   conversation's sums: a follow-up's client does not read its turns)
--   image_sha: the sha256 of the image the turn is about ('' = none; argv[3] holds its bytes when sent now)
--   answer_bytes: the answer's share of the text quota, reserved at its longest
--   in the settings (argv[2], common.lua), those of the same names (worker.config.Settings): user_queue_cap,
--   group_job_cap, group_submit_limit, group_submit_window_s, image_quota_user_bytes, image_quota_group_bytes,
--   image_quota_total_bytes, image_ttl_s, text_quota_user_bytes, text_quota_group_bytes, text_quota_window_s,
--   history_ttl_s, stream_maxlen, history_max_turns, history_max_chars, max_images_per_request; and job_ttl_s: how
--   long the job's hash and stream live
--   history_total_bytes: the history budget; global_queue_cap: the waiting room (both worker.store.history_budget)
--   index_digest: remember the conversation under this digest of a stateless client's messages (absent = not)
--   newest: remember it as its identity's newest conversation (absent = not)
--   notify: the stream its start is announced on (Keys.started_notices of the page following it; absent = none)
-- argv[3]: the image's bytes when the turn sends one now, else '' (JSON cannot carry raw bytes).
--   capacity, shared, light_from (optional): the workers' slots as the caller last read them (POP's arguments): when
--   one is free, SUBMIT then dispatches the next job in line (POP's step) in the same call
-- Returns {position}, or {position, job, dispatch_n, conv} when it dispatched a job (POP's reply), or {negative code}
-- (see ``worker.queue.job_states.REFUSALS``).
local job, user, group, conv, now, turn = args.job, args.user, args.group, args.conv, args.now, args.turn
local q, qg = args.queue_user, args.queue_group
local image = argv[3]
local JK, SK = KEY.job .. job, KEY.stream .. job
local CK = KEY.conv .. conv
local TK = CK .. TURNS_SUFFIX
local IK = KEY.image .. args.image_sha
local QU, QG = KEY.user_image_quota .. user, KEY.group_image_quota .. group
local TU, TG = KEY.user_text_quota .. user, KEY.group_text_quota .. group
local RK = KEY.submit_rate .. group
local QT, HELD, SIZES = KEY.total_image_quota, KEY.images_held, KEY.image_sizes
local HOLDERS, OWNERS = KEY.image_holders, KEY.image_owners
local image_ttl = args.image_ttl_s
-- the answer is stored too (appended to the turns at FINISH): reserved at its longest here, as admission is the
-- only place a refusal costs nothing
local history = args.history or {}
local text_bytes = #args.payload + #turn + args.answer_bytes
for _, earlier in ipairs(history) do text_bytes = text_bytes + #earlier end
-- what the conversation holds with this question, as the history limits count it: {turns, characters, pictures}
local measured
if turn ~= '' then
  local chars, images = args.turn_chars, args.turn_images
  if args.new_conv then
    if redis.call('EXISTS', CK) == 1 then return {-3} end
    local c, i = turns_measure(history)
    measured = {#history + 1, chars + c, images + i}
  else
    local conv_fields = redis.call('HMGET', CK, CONV.user, CONV.pending, CONV.chars, CONV.images)
    if conv_fields[1] ~= user then return {-3} end
    local held = redis.call('LLEN', TK)
    if args.expect_turns and held ~= args.expect_turns then return {-4} end
    local pending = conv_fields[2]
    if pending then
      local st = redis.call('HGET', KEY.job .. pending, JOB.state)
      if st == STATE.queued or st == STATE.dispatched or st == STATE.started then return {-4} end
    end
    local c, i = tonumber(conv_fields[3] or ''), tonumber(conv_fields[4] or '')
    if not c or not i then c, i = turns_measure(redis.call('LRANGE', TK, 0, -1)) end  -- kept by an earlier version
    measured = {held + 1, chars + c, images + i}
  end
  if measured[1] > args.history_max_turns or measured[2] > args.history_max_chars then return {-13} end
  if measured[3] > args.max_images_per_request then return {-14} end
end
-- the counters admission reads, in one round of reads: its rate, the text quotas, the history budget
local counted = redis.call('MGET', RK, TU, TG, KEY.history_total)
local submits, text_user, text_group, history_held = tonumber(counted[1] or '0'), tonumber(counted[2] or '0'),
  tonumber(counted[3] or '0'), tonumber(counted[4] or '0')
if submits >= args.group_submit_limit then return {-6} end
-- the caps count real identities and groups even in FIFO mode, where everyone shares one list
local mine_waiting = queued_by_user(user, q)
if mine_waiting >= args.user_queue_cap then return {-1} end
-- an identity with questions waiting asks from another group (its address changed): this one waits with them, in
-- their group's turn (queue_group_of), and counts against the caps and quotas of the group it was asked from
if mine_waiting > 0 and q == user then qg = queue_group_of(q) or qg end
local group_flight = tonumber(redis.call('HGET', KEY.inflight_by_group, group) or '0')
if tonumber(redis.call('HGET', KEY.queued_by_group, group) or '0') + group_flight >= args.group_job_cap then
  return {-5}
end
-- whether the line's group has a job in flight, as the line reads it (its own group's count; FIFO's shared group
-- counts none)
local line_flight
if qg == group then line_flight = group_flight > 0 end
-- the waiting room: the line holds each queued question once, so its size is the count (no script below changes it
-- before the question joins it: what gives way for this turn is never waiting, docs/redis_memory.md)
local waiting = redis.call('ZCARD', KEY.line)
if waiting >= args.global_queue_cap then return {-2} end
-- Image bytes sent with a turn are charged to its identity and address whether or not the same bytes are stored
-- already, and checked against the service total either way: an answer that depended on whether the image
-- exists would tell a stranger whether anyone uploaded that picture.
local sent_image = image ~= ''
local new_image = sent_image and redis.call('EXISTS', IK) == 0
-- The total is what is held now: images whose TTL has run out give their bytes back (a bounded batch a call; a
-- backlog only over-counts until later calls), when a turn sends a picture, the only time the total is checked.
-- A window of new bytes would let images stored late in one window outlive it (twice the total held), and a turn
-- about an old image would keep it alive past any window. Expiry times are Redis's own clock, the one that expires
-- the images (a UI replica's clock may be off).
local held_now = now_s()
local expires = held_now + image_ttl
if sent_image then
  redis.call('PERSIST', QT)  -- a counter written as a window with a TTL (older versions) must not expire
  for _, gone in ipairs(redis.call('ZRANGEBYSCORE', HELD, '-inf', held_now, 'LIMIT', 0, 256)) do
    no_longer_held(gone)
  end
  if tonumber(redis.call('GET', QT) or '0') < 0 then redis.call('SET', QT, 0) end
end
-- Past the total, pictures give way, at most 64 a call, never one a live job needs: otherwise a store filled by
-- strangers would refuse every new picture of everyone for a day. They go from the client group holding the most
-- bytes, its least recently used first (every turn about a picture renews it): were the least recently used of
-- everyone to go first, 17 addresses at their quota would empty every idle chat's picture in 70 s; this
-- way a flood mostly evicts itself. Only when that finds nothing that may go (or for pictures stored without an
-- owner) do they go by age alone. What gives way is chosen here and removed only once the turn is admitted.
local give_way, chosen = {}, {}
local function choose(key)
  table.insert(give_way, key)
  chosen[key] = true
  return tonumber(redis.call('HGET', SIZES, key) or '0')
end
if sent_image then
  if tonumber(redis.call('GET', QU) or '0') + #image > args.image_quota_user_bytes then return {-7} end
  if tonumber(redis.call('GET', QG) or '0') + #image > args.image_quota_group_bytes then return {-8} end
  local excess = tonumber(redis.call('GET', QT) or '0') + #image - args.image_quota_total_bytes
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
    local key = redis.call('ZRANGE', KEY.images_of .. largest, at, at)[1]
    looks, seen[largest] = looks + 1, at + 1
    if not key then
      spent[largest] = true
    elseif key ~= IK and not needed(key) then
      local size = choose(key)
      excess, freed[largest] = excess - size, (freed[largest] or 0) + size
    end
  end
  if excess > 0 then  -- and as a last resort (every large holder's pictures needed), by age alone
    for _, key in ipairs(redis.call('ZRANGE', HELD, 0, 63)) do
      if excess <= 0 then break end
      if key ~= IK and not chosen[key] and not needed(key) then
        excess = excess - choose(key)
      end
    end
  end
  if excess > 0 then return {-11} end
end
if text_user + text_bytes > args.text_quota_user_bytes then return {-9} end
if text_group + text_bytes > args.text_quota_group_bytes then return {-10} end
-- The history budget (docs/redis_memory.md): the conversation is charged what it holds with this turn, its answer
-- reserved at its longest (FINISH charges what it stored instead). Past the budget, the least recently used
-- conversations give way whole: chosen here, cleared once the turn is admitted. Only when every other conversation
-- is being answered is the turn refused (busy), and then nothing gives way.
local conv_size, conv_before, reserve, clear, notices = 0, 0, 0, {}, {}
if turn ~= '' then
  reserve = args.answer_bytes + TURN_BYTES
  -- what the conversation holds before this turn: a new one its earlier turns; one continued its charge, which
  -- every step that changes what it holds keeps exact (FINISH, TRUNCATE), so a follow-up costs the same however long
  -- the conversation is. Only a conversation not charged (its charge given back as it expired) is measured here.
  local charged = not args.new_conv and redis.call('HGET', KEY.conversation_sizes, conv)
  conv_before = tonumber(charged or '0')
  local held = conv_before
  if args.new_conv then
    held = conversation_bytes(history, 0)
  elseif not charged then
    held = conversation_bytes(redis.call('LRANGE', TK, 0, -1), redis.call('SCARD', KEY.chat_indexes_of .. conv))
  end
  conv_size = held + #turn + TURN_BYTES + reserve + (args.index_digest and INDEX_BYTES or 0)
  local total = history_held
  if total - conv_before + conv_size > args.history_total_bytes then
    -- near the budget: conversations whose TTL ran out give their bytes back first (they are charged until then)
    history_expired(held_now)
    total = tonumber(redis.call('GET', KEY.history_total) or '0')
  end
  local left
  clear, notices, left = choose_history(total - conv_before + conv_size - args.history_total_bytes, conv, 64)
  if left > 0 then return {-12} end
end
-- admitted: from here on, only writes
if redis.call('INCR', RK) == 1 then redis.call('EXPIRE', RK, args.group_submit_window_s) end
for _, tk in ipairs({TU, TG}) do  -- a fixed window from the first charge: a day's text, not a week of it
  if redis.call('INCRBY', tk, text_bytes) == text_bytes then redis.call('EXPIRE', tk, args.text_quota_window_s) end
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
  redis.call('ZADD', KEY.images_of .. group, expires, IK)
  redis.call('EXPIRE', KEY.images_of .. group, image_ttl)
elseif args.image_sha ~= '' and redis.call('EXISTS', IK) == 1 then  -- a turn about an image sent earlier: kept alive
  redis.call('EXPIRE', IK, image_ttl)
  if redis.call('HEXISTS', SIZES, IK) == 0 then  -- held but not counted (purged early, or stored before the count)
    local size = redis.call('STRLEN', IK)
    redis.call('INCRBY', QT, size)
    redis.call('HSET', SIZES, IK, size)
  end
  redis.call('ZADD', HELD, expires, IK)
  local owner = redis.call('HGET', OWNERS, IK)
  if owner then
    redis.call('ZADD', KEY.images_of .. owner, expires, IK)
    redis.call('EXPIRE', KEY.images_of .. owner, image_ttl)
  end
end
-- this job needs its image until it ends (FINISH takes it out of the image's jobs: JOB.picture names the image)
local needs_picture = args.image_sha ~= '' and redis.call('EXISTS', IK) == 1
if needs_picture then
  redis.call('SADD', KEY.picture_jobs .. IK, job)
  redis.call('EXPIRE', KEY.picture_jobs .. IK, args.job_ttl_s)
end
for _, qk in ipairs(charged) do  -- a fixed window from the first charge, as for text: pushing the expiry out on
  -- every charge would count bytes since the last quiet day, and a busy service would never get its quota back
  if redis.call('INCRBY', qk, #image) == #image or redis.call('TTL', qk) < 0 then
    redis.call('EXPIRE', qk, image_ttl)
  end
end
local job_fields = {JOB.payload, args.payload, JOB.user, user, JOB.qkey, q, JOB.group, group, JOB.qgroup, qg,
                    JOB.conv, conv, JOB.state, STATE.queued, JOB.enqueued_at, now, JOB.attempts, 0, JOB.dispatch_n, 0}
if turn ~= '' then
  for _, gone in ipairs(clear) do clear_conversation(gone, held_now) end
  for _, gone in ipairs(notices) do drop_notice(gone) end
  local ttl = args.history_ttl_s
  redis.call('HSET', KEY.conversation_sizes, conv, conv_size)
  redis.call('INCRBY', KEY.history_total, conv_size - conv_before)
  redis.call('ZADD', KEY.conversations_held, held_now + ttl, conv)
  if args.index_digest then  -- a stateless client's messages, by their digest (worker.store.conversation_index)
    local entry = KEY.chat_index .. user .. ':' .. args.index_digest
    redis.call('SET', entry, conv, 'EX', ttl)
    redis.call('SADD', KEY.chat_indexes_of .. conv, entry)
    redis.call('EXPIRE', KEY.chat_indexes_of .. conv, ttl)
  end
  if args.newest then redis.call('SET', KEY.newest .. user, conv, 'EX', ttl) end
  if args.new_conv then
    redis.call('HSET', CK, CONV.user, user, CONV.created, now, CONV.pending, job, CONV.chars, measured[2],
               CONV.images, measured[3])
  else
    redis.call('HSET', CK, CONV.pending, job, CONV.chars, measured[2], CONV.images, measured[3])
  end
  if #history > 0 then redis.call('RPUSH', TK, unpack(history)) end
  table.insert(job_fields, JOB.turn)
  table.insert(job_fields, redis.call('RPUSH', TK, turn) - 1)
  redis.call('EXPIRE', CK, args.history_ttl_s)
  redis.call('EXPIRE', TK, args.history_ttl_s)
end
if reserve > 0 then
  table.insert(job_fields, JOB.reserved)
  table.insert(job_fields, reserve)
end
if args.notify then
  table.insert(job_fields, JOB.notify)
  table.insert(job_fields, args.notify)
end
if needs_picture then
  table.insert(job_fields, JOB.picture)
  table.insert(job_fields, args.image_sha)
end
redis.call('HSET', JK, unpack(job_fields))
redis.call('EXPIRE', JK, args.job_ttl_s)
-- Nobody waits and a slot is free that this job may take: it is what POP would hand out next, so it goes out now
-- without passing through the line (its queued event, then its dispatch).
local inflight = args.capacity and waiting == 0 and redis.call('ZCARD', KEY.inflight)
if inflight and may_take_slot(qg, inflight, args.capacity, args.shared, args.light_from, line_flight) then
  xadd(job, STATE.queued, queued_event(1, now), args.stream_maxlen)
  redis.call('EXPIRE', SK, args.job_ttl_s)
  set_slot_layout(args.capacity, args.shared, args.light_from)
  return {1, job, dispatch_job(job, group, qg, now, 0, 0, ''), conv}
end
queued_by_user_add(user, q, 1)
redis.call('HINCRBY', KEY.queued_by_group, group, 1)
local place = queue_job(job, q, qg, line_flight)
redis.call('ZADD', KEY.queued_since, now, job)
local pos = position(job, q, qg, held_now, place)
xadd(job, STATE.queued, queued_event(pos, now), args.stream_maxlen)
redis.call('EXPIRE', SK, args.job_ttl_s)
-- A slot is free: hand out the next job now, as a dispatch pass would (POP's step, whichever job is next).
if inflight and inflight < args.capacity then
  local popped = pop_next(args.capacity, args.shared, args.light_from, now, nil, args.stream_maxlen)
  if popped then return {pos, unpack(popped)} end
end
return {pos}
