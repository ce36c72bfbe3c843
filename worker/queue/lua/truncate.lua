#!lua flags=allow-oom
-- TRUNCATE: a conversation keeps only its first `n_turns` turns (a retry or an edit), and its history-budget charge
-- and the sums the history limits count (CONV.chars, CONV.images) become what it holds now, so that SUBMIT can charge
-- and check a follow-up from them alone, without reading the turns.
-- It only removes, so a Redis over its maxmemory still runs it (allow-oom).
-- args: conv; n_turns (0: none kept)
-- The answer of a job still answering it (its cancel is on its way to its worker) stays reserved: its FINISH gives
-- the reserve back, appending nothing, as its question is gone. Returns the turns it holds now.
local conv = args.conv
local tk = KEY.conv .. conv .. TURNS_SUFFIX
if args.n_turns <= 0 then redis.call('DEL', tk) else redis.call('LTRIM', tk, 0, args.n_turns - 1) end
local turns = redis.call('LRANGE', tk, 0, -1)
local ck = KEY.conv .. conv
if redis.call('HEXISTS', ck, CONV.user) == 1 then  -- what the history limits count, as it holds now
  local chars, images = turns_measure(turns)
  redis.call('HSET', ck, CONV.chars, chars, CONV.images, images)
end
local charged = redis.call('HGET', KEY.conversation_sizes, conv)
if charged then
  local size = conversation_bytes(turns, redis.call('SCARD', KEY.chat_indexes_of .. conv))
  local answering = conversation_live(conv)
  if answering then size = size + tonumber(redis.call('HGET', KEY.job .. answering, JOB.reserved) or '0') end
  history_charge(conv, size - tonumber(charged))
end
return #turns
