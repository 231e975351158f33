-- Extend the lease if (and only if) this turn still holds the conversation.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] active_index: conversation -> lease expiry
-- ARGV[1] turn_id: the turn's id
-- ARGV[2] worker: the worker holding it
-- ARGV[3] lease_ms: the lease
-- ARGV[4] now_ms: now, in ms
-- ARGV[5] conv: the conversation key
-- Returns {0} when the turn lost the conversation, {1} when renewed, {2, reason} when renewed
-- but the turn was cancelled (/stop, interrupt) and must wind down.
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return {0}
end
local lease_until = tonumber(ARGV[4]) + tonumber(ARGV[3])
redis.call("HSET", KEYS[1], "lease_until", lease_until)
redis.call("ZADD", KEYS[2], lease_until, ARGV[5])
local cancelled = redis.call("HGET", KEYS[1], "cancelled")
if cancelled then
  return {2, cancelled}
end
return {1}
