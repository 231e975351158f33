-- A turn asks for a person's approval of one tool call: the request becomes durable and
-- pending, findable by id, by conversation and by expiry (the reaper denies it then).
-- KEYS[1] record: the approval's hash {request (JSON, never changed), conv, status, ...}
-- KEYS[2] pending: approval id -> expiry (ms)
-- KEYS[3] by_conv: conversation -> its pending approval id
-- ARGV[1] approval_id: the approval's id
-- ARGV[2] request: the request's JSON
-- ARGV[3] expires_ms: when no answer denies it
-- ARGV[4] conv: the conversation key
-- ARGV[5] ttl_s: how long the record is kept
-- Returns 1.
redis.call("DEL", KEYS[1])
redis.call("HSET", KEYS[1], "request", ARGV[2], "conv", ARGV[4], "status", "pending")
redis.call("EXPIRE", KEYS[1], tonumber(ARGV[5]))
redis.call("ZADD", KEYS[2], tonumber(ARGV[3]), ARGV[1])
redis.call("HSET", KEYS[3], ARGV[4], ARGV[1])
return 1
