-- An answer to a pending approval (approved, denied, expired, cancelled): the first one wins.
-- KEYS[1] record: the approval's hash {request, conv, status, decided_by, reason, decided_at}
-- KEYS[2] pending: approval id -> expiry (ms)
-- KEYS[3] by_conv: conversation -> its pending approval id
-- KEYS[4] deciding: approval id -> when decided (ms), until its turn has taken the answer
-- ARGV[1] approval_id: the approval's id
-- ARGV[2] status: approved | denied | expired | cancelled
-- ARGV[3] decided_by: who answered ("telegram:123", "http:api", "timeout", ...)
-- ARGV[4] reason: why (for a denial), may be ""
-- ARGV[5] now_ms: now, in ms
-- Returns 1 when this answer was recorded, 0 when the approval had been answered already,
-- -1 for an unknown approval.
local status = redis.call("HGET", KEYS[1], "status")
if not status then
  return -1
end
if status ~= "pending" then
  return 0
end
redis.call("HSET", KEYS[1], "status", ARGV[2], "decided_by", ARGV[3], "reason", ARGV[4],
  "decided_at", ARGV[5])
redis.call("ZREM", KEYS[2], ARGV[1])
local conv = redis.call("HGET", KEYS[1], "conv")
if redis.call("HGET", KEYS[3], conv) == ARGV[1] then
  redis.call("HDEL", KEYS[3], conv)
end
redis.call("ZADD", KEYS[4], tonumber(ARGV[5]), ARGV[1])
return 1
