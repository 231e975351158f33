-- A turn waiting on a fan-out gives its worker back: the conversation stays taken by the turn
-- ("parked"), with a lease that lasts until the fan-out's deadline.
-- KEYS[1] active hash, KEYS[2] active index
-- ARGV[1] turn id, ARGV[2] worker, ARGV[3] lease_until ms, ARGV[4] conversation key
-- Returns 1 when parked, -1 when this worker no longer held the turn.
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return -1
end
redis.call("HSET", KEYS[1], "worker", "parked:" .. ARGV[1], "lease_until", ARGV[3])
redis.call("ZADD", KEYS[2], tonumber(ARGV[3]), ARGV[4])
return 1
