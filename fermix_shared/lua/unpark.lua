-- The fan-out's callback takes its parked turn back.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] active_index: conversation -> lease expiry
-- ARGV[1] turn_id: the parked turn's id
-- ARGV[2] worker: the worker taking it back
-- ARGV[3] lease_ms: the lease
-- ARGV[4] now_ms: now, in ms
-- ARGV[5] conv: the conversation key
-- Returns {message, cancelled-or-""} when taken, {} when the turn is no longer parked (it was
-- closed meanwhile, e.g. recovered after its deadline).
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= "parked:" .. ARGV[1] then
  return {}
end
local lease_until = tonumber(ARGV[4]) + tonumber(ARGV[3])
redis.call("HSET", KEYS[1], "worker", ARGV[2], "lease_until", lease_until)
redis.call("ZADD", KEYS[2], lease_until, ARGV[5])
return {redis.call("HGET", KEYS[1], "message"), redis.call("HGET", KEYS[1], "cancelled") or ""}
