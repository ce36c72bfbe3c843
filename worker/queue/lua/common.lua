-- What every script starts with. The loader (worker.queue.scripts) puts this file after the script's shebang line
-- and a prelude it writes from worker.store.keys and worker.queue.fairness: the tables KEY (key names and prefixes),
-- JOB, CONV and SLOTS (hash fields), STATE (a job's states) and ENTRY (a stream entry's fields), TURNS_SUFFIX, and
-- the values HALF_LIFE, USAGE_WEIGHT and USAGE_CAP. Then come the helper files by concern (usage.lua, budgets.lua,
-- line.lua, lifecycle.lua, dispatch.lua), then the script's own body.

-- The script's named arguments: one JSON object (each script's header lists its fields; every script also gets
-- the deployment's key prefix as `prefix`).
local args = cjson.decode(ARGV[1])
-- KEY's names come without the key prefix, so the scripts' text, and Redis's cache of it, is the same whatever the
-- prefix: each name gets the prefix in front when a script first uses it (a script uses a few of them).
local KEY_NAMES, prefix = KEY, args.prefix
KEY = setmetatable({}, {__index = function(named, name)
  local key = KEY_NAMES[name]
  if key == nil then error('KEY.' .. tostring(name) .. ' is not a key worker.store.keys declares') end
  key = prefix .. key
  rawset(named, name, key)
  return key
end})
local function uq(q) return KEY.user_queue .. q end
local function gq(g) return KEY.group_queue .. g end
local function xadd(job, etype, data, maxlen)
  return redis.call('XADD', KEY.stream .. job, 'MAXLEN', '~', maxlen, '*', ENTRY.type, etype, ENTRY.data, data)
end
local function hdecr(key, field)
  if tonumber(redis.call('HINCRBY', key, field, -1)) <= 0 then redis.call('HDEL', key, field) end
end
-- Server time in seconds: a group's usage is kept in one clock, whichever process runs the script. Read once a
-- script: one atomic step happens at one instant.
local NOW
local function now_s()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) + tonumber(t[2]) / 1e6
  end
  return NOW
end
-- A sorted-set score as Redis returns it (a string, possibly "-inf" or "inf"), as a number.
local function score_number(s)
  if s == '-inf' then return -math.huge elseif s == 'inf' or s == '+inf' then return math.huge end
  return tonumber(s)
end
