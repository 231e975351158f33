-- Put a message at the head of a conversation's inbox (a compaction due after a turn).
-- KEYS[1] inbox: the conversation's inbox list
-- KEYS[2] queued_index: conversation -> waiting since
-- ARGV[1] message: the message JSON
-- ARGV[2] conv: the conversation key
-- ARGV[3] now_ms: now, in ms
redis.call("LPUSH", KEYS[1], ARGV[1])
redis.call("ZADD", KEYS[2], "NX", tonumber(ARGV[3]), ARGV[2])
return redis.call("LLEN", KEYS[1])
