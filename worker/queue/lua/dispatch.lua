-- POP's step (pop.lua describes it), shared with FINISH, which takes a worker's next job in the slot its job freed.

-- At most this many of the oldest dispatched, unclaimed jobs are looked at for a worker taking its next job: they
-- are the jobs Celery is still carrying, a handful at most (affinity sends a few to their holders).
local UNCLAIMED_LOOKS = 16

-- Whether group qg may take a free slot with `inflight` jobs in flight: any group within the decode rows (`shared`),
-- beyond them a group with nothing in flight, past `light_from` only such a group that used the workers little.
-- flight: whether qg has a job in flight, when the caller read it (nil: read here).
local function may_take_slot(qg, inflight, capacity, shared, light_from, flight)
  if inflight >= capacity then return false end
  if inflight < shared then return true end
  if flight == nil then flight = has_flight(qg) end
  if flight then return false end
  return inflight < light_from or score_number(usage_key(qg)) <= light_bound(now_s())
end

-- queued -> dispatched: the job's group has one more in flight, the job its dispatch fields (`taker`: a worker that
-- starts it at once, or '' for Celery, which lists it as unclaimed). n and attempts: its dispatches so far. A job a
-- taker starts at once is written started here too (start_job's fields, in the same write; start_job with
-- from_line then does the rest). Returns its dispatch number.
local function dispatch_job(job, group, qg, now, n, attempts, taker)
  local flying = redis.call('HINCRBY', KEY.inflight_by_group, group, '1')
  -- a group with something in flight is not idle: serve_group forgot its member (a job SUBMIT sends straight out
  -- never was in line). A job waiting in another group's turn than its own (FIFO mode's one shared group, or an
  -- identity's question asked from a new address, queue_group_of): that group is indexed again at its new place, and
  -- the job's own group, which has something in flight now, forgotten.
  if group ~= qg then
    idle_refresh(qg)
    if flying == 1 then idle_refresh(group) end
  end
  local fields = {JOB.state, STATE.dispatched, JOB.dispatched_at, now, JOB.target, taker, JOB.flight_t, now_s_text(),
                  JOB.dispatch_n, tostring(n + 1), JOB.attempts, tostring(attempts + 1)}
  if taker ~= '' then
    fields[2] = STATE.started
    for _, v in ipairs({JOB.worker, taker, JOB.started_at, now}) do table.insert(fields, v) end
  end
  redis.call('HSET', KEY.job .. job, unpack(fields))
  redis.call('ZADD', KEY.inflight, now, job)
  if taker == '' then redis.call('ZADD', KEY.unclaimed, now, job) end
  return n + 1
end

-- The fields of a queued job POP reads to serve it (the line's head is read with them: its group is the last).
local SERVE_FIELDS = {JOB.user, JOB.group, JOB.state, JOB.conv, JOB.dispatch_n, JOB.attempts, JOB.payload, JOB.notify,
                      JOB.turn, JOB.qkey, JOB.qgroup}

local function pop_next(capacity, shared, light_from, now, worker, maxlen)
  -- A worker taking its next job first starts the oldest job already dispatched to Celery for any worker (or for
  -- it) that no worker has claimed yet: it was popped earlier, so it must not start later than the jobs popped after
  -- it, which a taking worker would otherwise start at once while it still travels through Celery. Its Celery
  -- message then fails CLAIM (not dispatched any more) and is dropped. It is in flight already: no slot is used.
  if worker then
    for _, j in ipairs(redis.call('ZRANGE', KEY.unclaimed, 0, UNCLAIMED_LOOKS - 1)) do
      local f = redis.call('HMGET', KEY.job .. j, JOB.state, JOB.target, JOB.dispatch_n, JOB.conv)
      if f[1] ~= STATE.dispatched then
        redis.call('ZREM', KEY.unclaimed, j)  -- ended or put back meanwhile
      elseif not f[2] or f[2] == '' or f[2] == worker then
        redis.call('HSET', KEY.job .. j, JOB.target, worker)
        local s = start_job(j, worker, now, maxlen)
        return {j, tonumber(f[3]), f[4] or '', 1, s[1], s[2], s[3], s[4], s[5], 0, s[6], s[7]}
      end
    end
  end
  local inflight = redis.call('ZCARD', KEY.inflight)
  if inflight >= capacity then return nil end
  local newcomers_only, light_only = inflight >= shared, inflight >= light_from
  -- the slot layout position() reads (POSITION, and the queued event of SUBMIT and REQUEUE)
  set_slot_layout(capacity, shared, light_from)
  while true do
    local qg, first, head_job, head_fields
    if light_only then
      first = redis.call('ZRANGEBYSCORE', KEY.light_line, '-inf', light_bound(now_s()), 'LIMIT', 0, 1)[1]
      qg = first and group_of_idle(first)
    elseif newcomers_only then
      first = redis.call('ZRANGE', KEY.idle_line, 0, 0)[1]
      qg = first and group_of_idle(first)
    else
      first = redis.call('ZRANGE', KEY.line, 0, 0)[1]
      if first then  -- (the head of the line is the job its group serves next: read once, for both)
        head_job = job_of(first)
        head_fields = redis.call('HMGET', KEY.job .. head_job, unpack(SERVE_FIELDS))
        qg = head_fields[11]
      end
      if first and not qg then redis.call('ZREM', KEY.line, first) end  -- its hash expired: not a job any more
    end
    if not qg then
      if not first or light_only or newcomers_only then return nil end
      -- (a member whose hash expired was dropped above: look again)
    else
      local job = serve_group(qg, string.sub(first, 1, PLACE_WIDTH))  -- (every member starts with its group's place)
      if not job then  -- a group named without queued jobs: drop what named it, then look again
        if not light_only and not newcomers_only then redis.call('ZREM', KEY.line, first) end
        idle_forget(qg, string.sub(first, 1, PLACE_WIDTH))  -- (its idle member, at the place that named it)
        if in_line(qg) then idle_refresh(qg) else leave_line(qg) end
      else
        redis.call('ZREM', KEY.queued_since, job)
        local f = job == head_job and head_fields or redis.call('HMGET', KEY.job .. job, unpack(SERVE_FIELDS))
        if f[1] then queued_by_user_add(f[1], f[10] or f[1], -1) end
        local group = f[2] or f[1]
        if group then hdecr(KEY.queued_by_group, group) end
        if f[3] ~= STATE.queued then
          idle_refresh(qg)
        else
          local conv = f[4] or ''
          -- a worker taking its next job starts it here, unless another worker holds its conversation's cache
          local holder = worker and conv ~= '' and redis.call('GET', KEY.holder .. conv)
          local taker = worker and (not holder or holder == worker) and worker or ''
          local n = dispatch_job(job, group, qg, now, tonumber(f[5] or '0'), tonumber(f[6] or '0'), taker)
          if taker ~= '' then
            local s = start_job(job, worker, now, maxlen, {f[7], f[2], f[4], f[8], f[9]})
            return {job, n, conv, 1, s[1], s[2], s[3], s[4], s[5], holder and 1 or 0, s[6], s[7]}
          end
          return {job, n, conv}
        end
      end
    end
  end
end
