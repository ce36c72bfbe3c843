#!lua flags=no-writes,allow-oom
-- POSITION: queued jobs' 1-based places in the order the queue will serve them (read only). Each costs O(log N) in
-- the N jobs waiting, so a page asks for every waiting tab it follows once a second in one call.
-- args: jobs: the job ids
-- Returns the seconds each place in line adds (the service-time average over the decode rows the last POP counted;
-- '' while unknown), then one number per job: its position, or 0 when it is not queued (any more).
local now, per_place = now_s(), seconds_per_place()
local out = {per_place and tostring(per_place) or ''}
for i, job in ipairs(args.jobs) do
  local f = redis.call('HMGET', KEY.job .. job, JOB.state, JOB.qkey, JOB.qgroup)
  local pos = f[1] == STATE.queued and position(job, f[2], f[3] or f[2], now)
  out[i + 1] = pos or 0
end
return out
