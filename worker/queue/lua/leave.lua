#!lua
-- LEAVE: the conversation's owner left it with "New conversation" at `at` (the page's clock, the one a browser's
-- kept chat is timed by), so a page reloaded before the browser kept that it left does not reopen it (CONV.left;
-- ui.chat.tab_session). Only the owner's, and only while the conversation exists: a plain HSET on an expired one
-- would make a hash without a TTL. It grows what Redis holds, so a Redis over its maxmemory refuses it (no flags).
-- args: user, conv, at
-- Returns 1 when it was written, 0 when the conversation is gone or not the user's.
local CK = KEY.conv .. args.conv
if redis.call('HGET', CK, CONV.user) ~= args.user then return 0 end
redis.call('HSET', CK, CONV.left, args.at)
return 1
