-- Extend the lease if (and only if) this turn still holds the conversation.
-- KEYS[1] active hash; ARGV[1] turn id, ARGV[2] worker, ARGV[3] lease ms, ARGV[4] now ms
-- Returns 1 when renewed, 0 when the turn lost the conversation.
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return 0
end
redis.call("HSET", KEYS[1], "lease_until", tonumber(ARGV[4]) + tonumber(ARGV[3]))
return 1
