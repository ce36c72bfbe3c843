-- What every script starts with. The loader (worker.queue.scripts) puts this file after a prelude it writes from
-- worker.store.keys and worker.queue.fairness: the tables KEY_NAMES (key names and prefixes, without the key prefix),
-- JOB, CONV and SLOTS (hash fields), STATE (a job's states) and ENTRY (a stream entry's fields), TURNS_SUFFIX,
-- TOKEN_EVENT, the values HALF_LIFE, USAGE_WEIGHT and USAGE_CAP, and FIFO_GROUP. Then come the helper files by concern
-- (usage.lua, budgets.lua, line.lua, lifecycle.lua, dispatch.lua), then each script's body, run after begin_call.
--
-- Redis runs the scripts as functions of one library: this text and the helpers run once, when the library is
-- loaded, and each call only runs begin_call and the script's body. So what one call sets (its arguments, its
-- keys' prefix, its clock) lives in the locals below, and begin_call sets every one of them afresh.

-- The call's named arguments: one JSON object (each script's header lists its fields; every script also gets the
-- deployment's key prefix as `prefix`), and its raw arguments (argv[3], ...: bytes JSON cannot carry).
local args, argv
-- argv[2]: the deployment's settings a script reads, one JSON object the same on every call of a deployment ('' =
-- none). args reads a field it lacks from them. Each text is decoded once and kept (decoding SUBMIT's twenty settings
-- cost about as much as ten commands a call); past SETTINGS_KEPT texts the kept ones start afresh.
local SETTINGS_KEPT = 64
local settings_by_text, settings_kept = {}, 0
local function settings_for(text)
  if not text or text == '' then return nil end
  local named = settings_by_text[text]
  if named then return named end
  if settings_kept >= SETTINGS_KEPT then settings_by_text, settings_kept = {}, 0 end
  named = {__index = cjson.decode(text)}
  settings_by_text[text], settings_kept = named, settings_kept + 1
  return named
end
-- KEY.<name>: the key of that name with the call's prefix in front. KEY_NAMES come without the prefix, so the
-- library's text, and Redis's copy of it, is the same whatever the prefix; each prefix's names are made once and
-- kept (a few prefixes share one Redis; past KEY_PREFIXES_KEPT the kept ones start afresh).
local KEY
local KEY_PREFIXES_KEPT = 64
local keys_by_prefix, prefixes_kept = {}, 0
local function keys_for(prefix)
  local named = keys_by_prefix[prefix]
  if named then return named end
  if prefixes_kept >= KEY_PREFIXES_KEPT then keys_by_prefix, prefixes_kept = {}, 0 end
  named = setmetatable({}, {__index = function(t, name)
    local key = KEY_NAMES[name]
    if key == nil then error('KEY.' .. tostring(name) .. ' is not a key worker.store.keys declares') end
    key = prefix .. key
    rawset(t, name, key)
    return key
  end})
  keys_by_prefix[prefix], prefixes_kept = named, prefixes_kept + 1
  return named
end
-- Server time in seconds: a group's usage is kept in one clock, whichever process runs the script. Read once a
-- call: one atomic step happens at one instant.
local NOW, NOW_TEXT
-- What a helper read once for the whole call, by its name (line.lua's slot layout): each call starts with none.
local CALL
local function begin_call(call_argv)
  argv = call_argv
  args = cjson.decode(call_argv[1])
  local settings = settings_for(call_argv[2])
  if settings then setmetatable(args, settings) end
  KEY = keys_for(args.prefix)
  NOW, NOW_TEXT, CALL = nil, nil, {}
end
local function now_s()
  if not NOW then
    local t = redis.call('TIME')
    NOW = tonumber(t[1]) + tonumber(t[2]) / 1e6
    NOW_TEXT = t[1] .. '.' .. string.rep('0', 6 - #t[2]) .. t[2]
  end
  return NOW
end
-- The same instant as text (microseconds), for a command's argument: a Lua number given to redis.call is printed
-- with "%.14g" each time, which costs about as much as a small command.
local function now_s_text()
  now_s()
  return NOW_TEXT
end
local function uq(q) return KEY.user_queue .. q end
local function gq(g) return KEY.group_queue .. g end
local function xadd(job, etype, data, maxlen)
  return redis.call('XADD', KEY.stream .. job, 'MAXLEN', '~', maxlen, '*', ENTRY.type, etype, ENTRY.data, data)
end
-- Count one down in hash `key`, the field gone at zero; returns the count left.
local function hdecr(key, field)
  local left = redis.call('HINCRBY', key, field, '-1')
  if left <= 0 then redis.call('HDEL', key, field) end
  return left
end
-- A sorted-set score as Redis returns it (a string, possibly "-inf" or "inf"), as a number.
local function score_number(s)
  if s == '-inf' then return -math.huge elseif s == 'inf' or s == '+inf' then return math.huge end
  return tonumber(s)
end
