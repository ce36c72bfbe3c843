-- POP's step (pop.lua describes it), shared with FINISH, which takes a worker's next job in the slot its job freed.

-- At most this many of the oldest dispatched, unclaimed jobs are looked at for a worker taking its next job: they
-- are the jobs Celery is still carrying, a handful at most (affinity sends a few to their holders).
local UNCLAIMED_LOOKS = 16

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
        return {j, tonumber(f[3]), f[4] or '', 1, s[1], s[2], s[3], s[4], s[5], 0}
      end
    end
  end
  local inflight = redis.call('ZCARD', KEY.inflight)
  if inflight >= capacity then return nil end
  local newcomers_only, light_only = inflight >= shared, inflight >= light_from
  -- the slot layout position() reads (POSITION, and the queued event of SUBMIT and REQUEUE)
  redis.call('HSET', KEY.slots, SLOTS.capacity, capacity, SLOTS.shared, shared, SLOTS.light_from, light_from)
  while true do
    local qg, first
    if light_only then
      first = redis.call('ZRANGEBYSCORE', KEY.light_line, '-inf', light_bound(now_s()), 'LIMIT', 0, 1)[1]
      qg = first and group_of_idle(first)
    elseif newcomers_only then
      first = redis.call('ZRANGE', KEY.idle_line, 0, 0)[1]
      qg = first and group_of_idle(first)
    else
      first = redis.call('ZRANGE', KEY.line, 0, 0)[1]
      qg = first and redis.call('HGET', KEY.job .. job_of(first), JOB.qgroup)
      if first and not qg then redis.call('ZREM', KEY.line, first) end  -- its hash expired: not a job any more
    end
    if not qg then
      if not light_only and not newcomers_only and redis.call('ZCARD', KEY.line) > 0 then
        -- (a member whose hash expired was dropped above: look again)
      else
        return nil
      end
    else
      local job = serve_group(qg)
      if not job then  -- a group indexed without queued jobs: drop what named it, then look again
        if not light_only and not newcomers_only then redis.call('ZREM', KEY.line, first) end
        idle_refresh(qg)
        if not in_line(qg) then leave_line(qg) end
      else
        redis.call('DECR', KEY.queued_count)
        redis.call('ZREM', KEY.queued_since, job)
        local jk = KEY.job .. job
        local f = redis.call('HMGET', jk, JOB.user, JOB.group, JOB.state, JOB.conv, JOB.dispatch_n, JOB.attempts)
        if f[1] then hdecr(KEY.queued_by_user, f[1]) end
        local group = f[2] or f[1]
        if group then hdecr(KEY.queued_by_group, group) end
        if f[3] ~= STATE.queued then
          idle_refresh(qg)
        else
          if redis.call('HINCRBY', KEY.inflight_by_group, group, 1) == 1 and group == qg then
            idle_forget(qg)  -- it has something in flight now
          else
            idle_refresh(qg)
          end
          local n, conv = tonumber(f[5] or '0') + 1, f[4] or ''
          -- a worker taking its next job starts it here, unless another worker holds its conversation's cache
          local holder = worker and conv ~= '' and redis.call('GET', KEY.holder .. conv)
          local taker = worker and (not holder or holder == worker) and worker or ''
          redis.call('HSET', jk, JOB.state, STATE.dispatched, JOB.dispatched_at, now, JOB.target, taker,
                     JOB.flight_t, now_s(), JOB.dispatch_n, n, JOB.attempts, tonumber(f[6] or '0') + 1)
          redis.call('ZADD', KEY.inflight, now, job)
          if taker ~= '' then
            local s = start_job(job, worker, now, maxlen)
            return {job, n, conv, 1, s[1], s[2], s[3], s[4], s[5], holder and 1 or 0}
          end
          redis.call('ZADD', KEY.unclaimed, now, job)
          return {job, n, conv}
        end
      end
    end
  end
end
