-- A job's life after admission: it starts on a worker (CLAIM, or POP for a worker taking its next job itself), and
-- it ends exactly once (FINISH, REQUEUE past its attempts).

-- A page's notice stream (Keys.started_notices) keeps about this many starts: it reads them within a tick.
local NOTICES_MAXLEN = 1000

-- dispatched -> started on `worker`, and what the worker reads to start it, so it needs no further round trip:
-- {payload, group, cancelled (0/1), conv, conv's owner, history, turn} ('' for what is missing; history: the
-- conversation's turns before the job's question, which a follow-up's payload does not carry, worker.store.jobs;
-- turn: the question's index in the conversation as SUBMIT appended it, -1 for none).
-- from_line: the job's {payload, group, conv, notify, turn} as its caller just read them, for a job dispatched
-- straight from the line to this worker (never listed as unclaimed, and written started by dispatch_job); nil for a
-- job Celery carried.
local function start_job(job, worker, now, maxlen, from_line)
  local jk = KEY.job .. job
  if not from_line then
    redis.call('HSET', jk, JOB.state, STATE.started, JOB.worker, worker, JOB.started_at, now)
    redis.call('ZREM', KEY.unclaimed, job)
  end
  redis.call('SADD', KEY.running .. worker, job)
  xadd(job, STATE.started, '{"worker": "' .. worker .. '", "t": ' .. now .. '}', maxlen)
  local f = from_line or redis.call('HMGET', jk, JOB.payload, JOB.group, JOB.conv, JOB.notify, JOB.turn)
  local owner = f[3] and redis.call('HGET', KEY.conv .. f[3], CONV.user)
  if f[4] and f[4] ~= '' then  -- the page following it reads its stream again now
    redis.call('XADD', f[4], 'MAXLEN', '~', NOTICES_MAXLEN, '*', ENTRY.data, job)
  end
  local history, turn = {}, tonumber(f[5] or '')
  if f[3] and turn and turn > 0 then history = redis.call('LRANGE', KEY.conv .. f[3] .. TURNS_SUFFIX, '0', turn - 1) end
  return {f[1] or '', f[2] or '', redis.call('EXISTS', KEY.cancel .. job), f[3] or '', owner or '', history,
          turn or -1}
end
-- End `job` in state `etype` with its terminal event (and its answer appended, `holder` then holding the
-- conversation's cache). only_state, only_worker: end it only while it is in this state / owned by this worker
-- (nil = any). Returns 1 when it ended the job, 0 when it had ended already or is not in only_state / only_worker's.
local function finish(job, etype, data, answer, stream_ttl, maxlen, holder, holder_ttl, only_state, only_worker, tail,
                      answer_chars)
  local jk = KEY.job .. job
  local f = redis.call('HMGET', jk, JOB.state, JOB.user, JOB.conv, JOB.worker, JOB.qkey, JOB.turn, JOB.group,
                       JOB.qgroup, JOB.reserved, JOB.flight_t, JOB.picture)
  local state = f[1]
  if state == STATE.done or state == STATE.error or state == STATE.cancelled then return 0 end
  if (only_state and state ~= only_state) or (only_worker and f[4] ~= only_worker) then return 0 end
  local user, group = f[2] or '', f[7] or f[2] or ''
  local q, qg = f[5] or user, f[8] or f[7] or f[5] or user
  if state == STATE.queued then unqueue(job, q, qg, user, group) end
  if state == STATE.dispatched or state == STATE.started then
    charge_usage(group, f[10])
    left_flight(group, qg)
  end
  if f[3] then
    local ck = KEY.conv .. f[3]
    local tk = ck .. TURNS_SUFFIX
    -- append only right after this job's own question, while it is the last turn: never twice, never after a
    -- truncate removed it (its turn index to the end: that question alone)
    local from_question = f[6] and redis.call('LRANGE', tk, f[6], '-1')
    local appended = false
    if etype == STATE.done and answer ~= '' and from_question and #from_question == 1
       and string.find(from_question[1], job, 1, true) then
      redis.call('RPUSH', tk, answer)
      appended = true
      if holder ~= '' then redis.call('SET', KEY.holder .. f[3], holder, 'EX', holder_ttl) end
    end
    local conv_fields = redis.call('HMGET', ck, CONV.pending, CONV.chars)
    if conv_fields[1] == job then redis.call('HDEL', ck, CONV.pending) end
    if appended and conv_fields[2] then  -- (answer_chars: the answer's characters as its caller counted them)
      redis.call('HINCRBY', ck, CONV.chars, answer_chars or (turn_measure(answer)))
    end
    -- the answer's bytes were charged to the history budget at their longest: charge what it stored instead
    local reserved = tonumber(f[9] or '0')
    if reserved > 0 then history_charge(f[3], (appended and #answer + TURN_BYTES or 0) - reserved) end
  end
  -- its picture no longer needs keeping for it (picture_jobs holds the live jobs only: `needed` reads a few)
  if f[11] then redis.call('SREM', KEY.picture_jobs .. KEY.image .. f[11], job) end
  -- a started job is in its worker's set of stopped jobs only when its cancel flag was set
  local flagged = redis.call('DEL', KEY.cancel .. job) == 1
  if state == STATE.started then
    redis.call('SREM', KEY.running .. f[4], job)
    if flagged then redis.call('SREM', KEY.cancels .. f[4], job) end
  end
  if state ~= STATE.queued then redis.call('ZREM', KEY.inflight, job) end  -- (unqueue did a queued job's part)
  if state == STATE.dispatched then redis.call('ZREM', KEY.unclaimed, job) end
  redis.call('HSET', jk, JOB.state, etype)
  redis.call('EXPIRE', jk, stream_ttl)
  if tail then xadd(job, TOKEN_EVENT, tail, maxlen) end
  xadd(job, etype, data, maxlen)
  redis.call('EXPIRE', KEY.stream .. job, stream_ttl)
  return 1
end
