-- A turn waiting on a fan-out gives its worker back: the conversation stays taken by the turn
-- ("parked"), with a lease that lasts until the fan-out's deadline.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] active_index: conversation -> lease expiry
-- ARGV[1] turn_id: the turn's id
-- ARGV[2] worker: the worker holding it
-- ARGV[3] lease_until_ms: when the parked turn's lease lapses
-- ARGV[4] conv: the conversation key
-- Returns 1 when parked, -1 when this worker no longer held the turn.
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return -1
end
redis.call("HSET", KEYS[1], "worker", "parked:" .. ARGV[1], "lease_until", ARGV[3])
redis.call("ZADD", KEYS[2], tonumber(ARGV[3]), ARGV[4])
return 1
