#!lua flags=allow-oom
-- MAKE_ROOM: a Redis over its maxmemory refused SUBMIT whole; old conversations and pictures give way so that the
-- turn can be admitted when it is asked again (worker.queue.job_states.JobStates.enqueue_raw). It runs over
-- maxmemory (allow-oom), and only deletes, besides the notices left to the owners of what it clears.
-- args: room_bytes: the bytes (as charged: worker.store.memory_model) to give back at least, if that much may go
--   keep: the conversation the refused turn continues (it stays)
-- Conversations go least recently used first, never one a job is answering; then, if that was not enough, pictures
-- by age, never one a live job needs. Returns the bytes given back (0: nothing could go).
local now = now_s()
history_expired(now)
local convs = choose_history(args.room_bytes, args.keep, 256)
local freed = 0
for _, conv in ipairs(convs) do freed = freed + clear_conversation(conv, now) end
if freed < args.room_bytes then
  for _, key in ipairs(redis.call('ZRANGE', KEY.images_held, 0, 63)) do
    if freed >= args.room_bytes then break end
    if not needed(key) then
      freed = freed + tonumber(redis.call('HGET', KEY.image_sizes, key) or '0')
      no_longer_held(key)
      redis.call('DEL', key)
    end
  end
end
return freed
