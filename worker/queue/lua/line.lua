-- The fair line: every queued job in one sorted set, in the order POP serves it, so that admitting, serving and
-- telling a job its place each cost O(log N) in the N jobs waiting (docs/design.md, "Fair dispatch").
--
-- Groups (client addresses or logins) are served round robin, one job a turn of the ring; inside a group its
-- identities are served round robin too. A job's virtual tag is (turn, place):
--   turn   how many turns of the ring come before it: its rank k (from 0) in its group's own round robin over its
--          identities (group_walk);
--   place  its group's place in the ring (KEY.places), a fixed-width string so that a sorted set orders equal turns
--          by it: a tier digit, then a number and an arrival sequence that break ties:
--            0  put back in line after its worker was lost (REQUEUE): ahead of everyone, the latest first;
--            1  waiting, not served since it last went idle: by its key, the time it started waiting plus a setback
--               for its recent use of the workers (setback below);
--            2  served in this busy period: behind every waiting group. Each time a group is served it moves to the
--               end of the ring (a fresh place after every other), and its jobs move up a turn. A served group that
--               starts waiting again goes first among the served. A group's busy period lasts while it has a job in
--               line or in flight, so a group starting to wait was served in it exactly when it has a job in flight.
-- KEY.line holds each queued job as score = turn, member = place .. job; ZRANK is its place in line, and the head of
-- the line is the job POP serves. That is the order a rotating ring of groups serves, job for job. Only the group
-- whose state changes (a job of it joins, leaves or is served) has its jobs rewritten: O(m log N) for its m queued
-- jobs, which the per-group caps bound; the other groups' tags stay as they are.
--
-- FIFO mode's one shared group (FIFO_GROUP, Settings.fifo: the benchmarks' first-come baseline) holds every queued
-- job, so no cap bounds its m: its jobs are tagged by arrival instead (turn = the line's arrival sequence; a job put
-- back after a lost worker, the negative of it: ahead of every other, the latest first), and its place stays while it
-- is in line, so serving, cancelling or putting back one of its jobs writes that job's tag alone (arrival_ordered).
-- Nor does it keep its jobs in lists, where a cancel's removal would scan every waiting job: KEY.fifo_line holds
-- them, each scored by its tag in the line, so its head is the job the group serves next.
--
-- Beyond the workers' decode rows POP serves only groups with nothing in flight, and in the last slots only such
-- groups that used the workers little lately (dispatch.lua): KEY.idle_line orders the groups in line with nothing in
-- flight by their place, and KEY.light_line the same groups by their usage (usage_key), ties by place. A group's
-- member of both is its place .. group: whatever changes or removes the place of a group that may be indexed
-- forgets the member written with the place it had (idle_forget), so the member is always known from the place.

local PLACE_WIDTH = 34  -- tier (1) + sub-tier (1) + number (20) + arrival sequence (12)
local COUNT_DOWN = 1e12  -- "latest first" places count down from here

local function place_string(tier, sub, value, seq)
  return string.format('%d%d%020.6f%012d', tier, sub, value, seq)
end
local function next_seq() return redis.call('INCR', KEY.line_seq) end
-- Whether group qg's jobs are tagged by arrival rather than by their turn in its round robin (FIFO mode's group).
local function arrival_ordered(qg) return qg == FIFO_GROUP end
local function job_of(member) return string.sub(member, PLACE_WIDTH + 1) end
local function group_of_idle(member) return string.sub(member, PLACE_WIDTH + 1) end
local function in_line(qg)
  if arrival_ordered(qg) then return redis.call('ZCARD', KEY.fifo_line) > 0 end
  return redis.call('LLEN', gq(qg)) > 0
end
local function has_flight(qg) return redis.call('HEXISTS', KEY.inflight_by_group, qg) == 1 end
-- An identity's questions waiting (its cap): in the fair line, where its queue q is its own, that queue's length; in
-- FIFO mode, where everyone shares one queue, KEY.queued_by_user counts them (queued_by_user_add keeps it, and only
-- there: a count the fair line can read off its lists would be two writes a question for nothing).
local function queued_by_user(user, q)
  if q == user then return redis.call('LLEN', uq(q)) end
  return tonumber(redis.call('HGET', KEY.queued_by_user, user) or '0')
end
-- The group in whose turn identity q's waiting questions wait (nil when none waits): its oldest's. Every question an
-- identity has waiting waits in that one group's turn (its own queue is one entry of that group's ring), even when
-- it asked from another group: an anonymous identity's group is its address, which can change while it waits.
local function queue_group_of(q)
  local oldest = redis.call('LINDEX', uq(q), 0)
  return oldest and redis.call('HGET', KEY.job .. oldest, JOB.qgroup)
end
local function queued_by_user_add(user, q, delta)
  if q == user then return end
  if delta > 0 then redis.call('HINCRBY', KEY.queued_by_user, user, delta) else hdecr(KEY.queued_by_user, user) end
end
-- The places of each tier (the sub-tier orders the served: 0 = starting to wait again, latest first; 1 = at the end).
local function requeued_place()
  local seq = next_seq()
  return place_string(0, 0, COUNT_DOWN - seq, seq)
end
local function waiting_place(key) return place_string(1, 0, key, next_seq()) end
local function served_place_front()
  local seq = next_seq()
  return place_string(2, 0, COUNT_DOWN - seq, seq)
end
local function served_place_end() return place_string(2, 1, 0, next_seq()) end
-- Whether a group at `place` (nil: none known) may be in KEY.waiting_since, which holds the groups waiting with a key.
local function may_wait_since(place) return not place or string.sub(place, 1, 1) == '1' end

-- A group's queued jobs in the order it serves them: round robin over its identities (KEY.group_queue), each
-- identity's jobs oldest first (KEY.user_queue).
local function group_walk(qg)
  local who, lists, total = redis.call('LRANGE', gq(qg), 0, -1), {}, 0
  for i, q in ipairs(who) do
    lists[i] = redis.call('LRANGE', uq(q), 0, -1)
    total = total + #lists[i]
  end
  local order, k = {}, 1
  while #order < total do
    for i = 1, #who do
      local job = lists[i][k]
      if job then table.insert(order, job) end
    end
    k = k + 1
  end
  return order
end

-- The slots POP keeps for groups with nothing in flight: a group is indexed (KEY.idle_line, KEY.light_line) exactly
-- while it is in line (it has a place) with nothing in flight.
-- Forget group qg's member written with place `place` (nil: it had none, so nothing is indexed).
local function idle_forget(qg, place)
  if not place then return end
  local member = place .. qg
  redis.call('ZREM', KEY.idle_line, member)
  redis.call('ZREM', KEY.light_line, member)
end
local function idle_index(qg, place, record)
  local member = place .. qg
  redis.call('ZADD', KEY.idle_line, '0', member)
  redis.call('ZADD', KEY.light_line, usage_key_of(record), member)  -- (its usage now, should it have changed)
end
-- Index group qg at its place (nil: read here) or forget it there, by what it has in line and in flight now. Its
-- place must be the one it was indexed with, if any (a caller changing the place forgets the old member first).
local function idle_refresh(qg, place)
  place = place or redis.call('HGET', KEY.places, qg)
  if not place then return end  -- not in line: not indexed (leaving the line forgot it)
  if has_flight(qg) or not in_line(qg) then
    idle_forget(qg, place)
  else
    idle_index(qg, place, usage_record(qg))
  end
end

-- Write the tags of every queued job of group qg from its place (old_place: the place they and its idle member were
-- written with, when it changed). keep_idle: leave the idle index alone (the caller sees to it). Returns the place.
local function rekey(qg, old_place, keep_idle)
  local place = redis.call('HGET', KEY.places, qg)
  local moved = old_place and old_place ~= place
  local function tag(job, turn)
    if moved then redis.call('ZREM', KEY.line, old_place .. job) end
    redis.call('ZADD', KEY.line, turn, place .. job)
  end
  if arrival_ordered(qg) then  -- (only when it starts waiting, or its jobs are adopted: each keeps its tag)
    local tagged = redis.call('ZRANGE', KEY.fifo_line, 0, -1, 'WITHSCORES')
    for i = 1, #tagged, 2 do tag(tagged[i], tagged[i + 1]) end
  else
    for k, job in ipairs(group_walk(qg)) do tag(job, k - 1) end
  end
  if not keep_idle then
    if moved then idle_forget(qg, old_place) end
    idle_refresh(qg, place)
  end
  return place
end

-- How far a group's recent use sets it back when it starts waiting: USAGE_WEIGHT seconds per (decayed) second in
-- flight, at most USAGE_CAP or, when groups have waited longer than that, at most the longest of their waits now
-- (KEY.waiting_since holds exactly the groups waiting with a key, by when they started). So a client re-asking the
-- moment its answer ended is not a newcomer, a newcomer goes ahead of everyone who used the workers lately however
-- long the line is, and a group that used them a lot queues at worst behind the whole line waiting now, never
-- behind a stream of later arrivals.
local function setback(record, now)
  local weighted = USAGE_WEIGHT * usage_at(record, now)
  if weighted <= USAGE_CAP then return weighted end
  local first = redis.call('ZRANGE', KEY.waiting_since, 0, 0, 'WITHSCORES')
  local longest = USAGE_CAP
  if first[2] then longest = math.max(longest, now - tonumber(first[2])) end
  return math.min(weighted, longest)
end

-- Group qg starts waiting: its place. front: put back after a lost worker, ahead of everyone; flight: whether it has
-- a job in flight (then it was served in this busy period). Returns the place and the group's usage record (read
-- once for the setback and the light index).
local function join_place(qg, front, flight)
  if front then return requeued_place() end
  if flight then return served_place_front() end
  local now, record = now_s(), usage_record(qg)
  redis.call('ZADD', KEY.waiting_since, now, qg)
  -- rounded as the place stores it; the arrival sequence keeps two groups starting at once in arrival order
  return waiting_place(now + setback(record, now)), record
end
-- Group qg starts waiting with the jobs its lists hold now (one, unless it was put back with others): its place,
-- then its jobs' tags.
local function join_line(qg, front)
  local place = join_place(qg, front, not front and has_flight(qg))
  redis.call('HSET', KEY.places, qg, place)
  rekey(qg)
end

-- Job `job` of identity q in group qg was just queued (SUBMIT): it goes to the end of q's queue, and gets its tag.
-- flight: whether qg has a job in flight, when the caller read it already (nil: read here). Returns its group's place
-- (for position()).
local function queue_job(job, q, qg, flight)
  local starts, place, turn  -- whether the group starts waiting with this job alone; its place, the job's tag
  local mine, identities
  if arrival_ordered(qg) then
    turn = next_seq()
    redis.call('ZADD', KEY.fifo_line, turn, job)
    place = redis.call('HGET', KEY.places, qg)
    starts = not place
  else
    mine = redis.call('RPUSH', uq(q), job)
    identities = mine == 1 and redis.call('RPUSH', gq(qg), q) or redis.call('LLEN', gq(qg))
    if identities > 1 then return rekey(qg) end
    starts, turn = mine == 1, mine - 1  -- one identity: its jobs are served in order, the new one last
    place = not starts and redis.call('HGET', KEY.places, qg)
  end
  if starts then
    if flight == nil then flight = has_flight(qg) end
    local record
    place, record = join_place(qg, false, flight)
    redis.call('HSET', KEY.places, qg, place)
    redis.call('ZADD', KEY.line, turn, place .. job)
    if not flight then idle_index(qg, place, record) end
    return place
  end
  redis.call('ZADD', KEY.line, turn, place .. job)
  return place
end

-- Group qg has no more queued jobs: it leaves the ring. (With nothing in flight either it is idle: it waits as a
-- newcomer, with its setback, when it asks again.)
-- place: its place, when the caller has it (nil: read here).
local function leave_line(qg, place)
  place = place or redis.call('HGET', KEY.places, qg)
  redis.call('HDEL', KEY.places, qg)
  if may_wait_since(place) then redis.call('ZREM', KEY.waiting_since, qg) end
  idle_forget(qg, place)
end
-- A job of group (in line as qg) left flight (it ended, or is put back in line). A group with something still in
-- flight was not indexed and is not now; one with nothing left in flight is, if it is in line. (A job that waited in
-- another group's turn, qg: in FIFO mode the line's one group, which counts nothing in flight, so is indexed
-- whenever in line; or its identity's, queue_group_of.)
local function left_flight(group, qg)
  if hdecr(KEY.inflight_by_group, group) <= 0 then idle_refresh(group) end
  if group ~= qg then idle_refresh(qg) end
end
-- A queued job leaves the line without being served (cancelled, timed out, or ended while waiting).
local function unqueue(job, q, qg, user, group)
  local by_arrival = arrival_ordered(qg)
  local removed
  if by_arrival then
    removed = redis.call('ZREM', KEY.fifo_line, job)
  else
    removed = redis.call('LREM', uq(q), 1, job)
  end
  if removed > 0 then
    queued_by_user_add(user, q, -1)
    hdecr(KEY.queued_by_group, group)
    local place = redis.call('HGET', KEY.places, qg)
    if place then redis.call('ZREM', KEY.line, place .. job) end
    if not by_arrival and redis.call('LLEN', uq(q)) == 0 then redis.call('LREM', gq(qg), 0, q) end
    if not in_line(qg) then leave_line(qg, place) elseif not by_arrival then rekey(qg) end
  end
  redis.call('ZREM', KEY.queued_since, job)
end

-- Serve group qg's next job (POP): take it from its lists and the line. The group is served from now on (its job in
-- flight says so): it moves to the end of the ring, and each of its other jobs up a turn. Its idle member goes (about
-- to have a job in flight, it is not idle; the caller indexes it again when it is: dispatch_job). place: its place,
-- as the line or the idle index the caller found it in names it (nil: read here). Returns the job (nil if the group
-- had none).
local function serve_group(qg, place)
  local job
  if arrival_ordered(qg) then
    job = redis.call('ZPOPMIN', KEY.fifo_line)[1]
  else
    local q = redis.call('LPOP', gq(qg))
    job = q and redis.call('LPOP', uq(q))
    if q and redis.call('LLEN', uq(q)) > 0 then redis.call('RPUSH', gq(qg), q) end
  end
  if not job then return nil end
  place = place or redis.call('HGET', KEY.places, qg)
  if place then redis.call('ZREM', KEY.line, place .. job) end
  local stays = in_line(qg)
  -- FIFO mode's group, still in line, keeps its place (still waiting), and its other jobs their tags
  local keeps_place = stays and arrival_ordered(qg)
  -- served now: its wait no longer bounds anyone's setback
  if may_wait_since(place) and not keeps_place then redis.call('ZREM', KEY.waiting_since, qg) end
  idle_forget(qg, place)
  if keeps_place then
    return job
  elseif stays then
    redis.call('HSET', KEY.places, qg, served_place_end())
    rekey(qg, place, true)
  else
    redis.call('HDEL', KEY.places, qg)
  end
  return job
end

-- The slot layout the last POP counted (KEY.slots): capacity, shared and light_from as numbers (nil while none). Read
-- once a call (a POSITION call tells hundreds of jobs their places), and kept current by set_slot_layout, the one
-- place that writes it. The same hash keeps the service-time average (FINISH folds each run time into it), what ETAs
-- rest on with the layout's rows: read with the layout, and written with it when the call writes one.
local function slot_layout()
  if not CALL.slots then
    local f = redis.call('HMGET', KEY.slots, SLOTS.capacity, SLOTS.shared, SLOTS.light_from, SLOTS.service_s)
    CALL.slots = {tonumber(f[1]), tonumber(f[2]), tonumber(f[3])}
    CALL.service = tonumber(f[4] or '')
  end
  return CALL.slots[1], CALL.slots[2], CALL.slots[3]
end
local function set_slot_layout(capacity, shared, light_from)
  local fields = {SLOTS.capacity, capacity, SLOTS.shared, shared, SLOTS.light_from, light_from}
  if CALL.service_unwritten then
    table.insert(fields, SLOTS.service_s)
    table.insert(fields, CALL.service_unwritten)
    CALL.service_unwritten = nil
  end
  redis.call('HSET', KEY.slots, unpack(fields))
  CALL.slots = {tonumber(capacity), tonumber(shared), tonumber(light_from)}
end
-- A job's run time on its worker folded into the average (FINISH): 0.8 of the old and 0.2 of the new, or the first run
-- time alone. Written by the call's set_slot_layout if it writes the layout after this, else by write_service_time,
-- which the caller runs before it returns.
local function fold_service_time(seconds)
  slot_layout()
  CALL.service = CALL.service and 0.8 * CALL.service + 0.2 * seconds or seconds
  CALL.service_unwritten = tostring(CALL.service)
end
local function write_service_time()
  if CALL.service_unwritten then
    redis.call('HSET', KEY.slots, SLOTS.service_s, CALL.service_unwritten)
    CALL.service_unwritten = nil
  end
end

-- Where a queued job stands: its place in line, or, for the next job of a group with nothing in flight when the
-- last POP kept slots for such groups (KEY.slots), its place among the groups competing for them, whichever is
-- nearer the front.
local function slot_position(job, q, qg, now, place)
  local capacity, shared, light_from = slot_layout()
  if not capacity or capacity <= shared then return nil end
  if arrival_ordered(qg) then
    if redis.call('ZRANGE', KEY.fifo_line, 0, 0)[1] ~= job then return nil end
  elseif redis.call('LINDEX', gq(qg), 0) ~= q or redis.call('LINDEX', uq(q), 0) ~= job then
    return nil
  end
  local member = place .. qg
  local eligible = redis.call('ZRANK', KEY.idle_line, member)  -- (nil: not indexed, something of it is in flight)
  if not eligible then return nil end
  eligible = eligible + 1
  if capacity > light_from then
    local used = score_number(redis.call('ZSCORE', KEY.light_line, member))
    if used <= light_bound(now) then  -- every group ahead of it there used less, so is light too
      return math.min(redis.call('ZRANK', KEY.light_line, member) + 1, eligible)
    end
  end
  return eligible
end
-- 1-based position of a queued job in the order the queue will serve it now; false when it is not in line. place:
-- its group's place when the caller has it (nil: read here).
local function position(job, q, qg, now, place)
  place = place or redis.call('HGET', KEY.places, qg)
  local rank = place and redis.call('ZRANK', KEY.line, place .. job)
  if not rank then return false end
  local slot = slot_position(job, q, qg, now, place)
  return slot and math.min(rank + 1, slot) or rank + 1
end
-- The seconds each place in line adds: the service-time average FINISH keeps over the decode rows the last POP counted
-- (KEY.slots); nil while either is unknown. What a queued event's and a place's ETA rest on.
local function seconds_per_place()
  local _, rows = slot_layout()
  local service = CALL.service
  if service and rows and rows > 0 then return service / rows end
  return nil
end
-- A queued event's JSON: the job's place, its ETA when known, and the caller's time.
local function queued_event(pos, now, extra)
  local per_place = seconds_per_place()
  local eta = per_place and string.format('%.1f', pos * per_place) or 'null'
  return '{"position": ' .. pos .. ', "eta_s": ' .. eta .. (extra or '') .. ', "t": ' .. now .. '}'
end
