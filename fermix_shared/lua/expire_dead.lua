-- A turn whose worker process stopped beating is treated as if its lease had lapsed, so the
-- next claim resumes it now instead of when the lease runs out. The checks go with the change:
-- the turn is still held by that worker (not finished, not claimed again, not parked: a parked
-- turn's worker is "parked:<turn>", which never beats) and the worker is still silent.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] active_index: conversation -> lease expiry
-- KEYS[3] beats: worker process -> last heartbeat (ms, Redis server time)
-- ARGV[1] worker: the worker the reaper found silent
-- ARGV[2] dead_ms: silence after which a worker is dead
-- ARGV[3] now_ms: now, in ms, on the clock leases are written in
-- ARGV[4] conv: the conversation key
-- Returns 1 when the turn's lease was ended, 0 when nothing changed.
redis.replicate_commands()
if redis.call("HGET", KEYS[1], "worker") ~= ARGV[1] then
  return 0
end
local beat = tonumber(redis.call("HGET", KEYS[3], ARGV[1]) or "")
if not beat then
  return 0
end
local t = redis.call("TIME")
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - beat < tonumber(ARGV[2]) then
  return 0
end
if tonumber(redis.call("HGET", KEYS[1], "lease_until") or "0") <= tonumber(ARGV[3]) then
  return 0
end
redis.call("HSET", KEYS[1], "lease_until", ARGV[3])
redis.call("ZADD", KEYS[2], tonumber(ARGV[3]), ARGV[4])
return 1
