-- Put a message at the head of a conversation's inbox (a compaction due after a turn).
-- KEYS[1] inbox, KEYS[2] queued index; ARGV[1] message JSON, ARGV[2] conversation, ARGV[3] now ms
redis.call("LPUSH", KEYS[1], ARGV[1])
redis.call("ZADD", KEYS[2], "NX", tonumber(ARGV[3]), ARGV[2])
return redis.call("LLEN", KEYS[1])
