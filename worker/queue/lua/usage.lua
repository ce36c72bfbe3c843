-- A client group's recent use of the workers: its jobs' seconds in flight, halved every HALF_LIFE seconds
-- (KEY.group_usage .. group holds "seconds:t", t in Redis time, until 20 half-lives after its last charge). FINISH
-- charges it; a group that starts waiting is set back by it (line.lua), and the last slots POP keeps go only to
-- groups that used the workers little lately.

-- A group's usage as stored ("seconds:t", or nil), read once by whoever needs both of what follows.
local function usage_record(g) return redis.call('GET', KEY.group_usage .. g) end
local function usage_at(record, now)
  if not record then return 0 end
  local seconds, t = string.match(record, '^([^:]+):(.+)$')
  return tonumber(seconds) * 0.5 ^ ((now - tonumber(t)) / HALF_LIFE)
end
local function usage(g, now) return usage_at(usage_record(g), now) end
-- Usage as a number whose order between groups never changes while their usage decays, for a sorted set:
-- log2(seconds) + t / HALF_LIFE, since every group's usage decays by the same factor. A group that used nothing has
-- '-inf'. A group is light (USAGE_WEIGHT x its usage within USAGE_CAP) when its key is at most light_bound(now).
local LOG2 = 0.69314718055994530942  -- math.log(2): a library runs without the math library while Redis loads it
local function usage_key_of(record)
  if not record then return '-inf' end
  local seconds, t = string.match(record, '^([^:]+):(.+)$')
  seconds = tonumber(seconds)
  if not seconds or seconds <= 0 then return '-inf' end
  return math.log(seconds) / LOG2 + tonumber(t) / HALF_LIFE
end
local function usage_key(g) return usage_key_of(usage_record(g)) end
local function light_bound(now)
  return math.log(USAGE_CAP / USAGE_WEIGHT) / LOG2 + now / HALF_LIFE
end
-- A job left flight for good (it ended): charge its group the time it held a slot since `since` (the job's
-- flight_t, Redis time).
local function charge_usage(group, since)
  if not since then return end
  local now = now_s()
  local total = usage(group, now) + math.max(0, now - tonumber(since))
  -- 20 half-lives without a charge leave under a millionth of it: then its key expires
  redis.call('SET', KEY.group_usage .. group, string.format('%.3f:%.3f', total, now),
             'EX', math.floor(HALF_LIFE * 20))
end
