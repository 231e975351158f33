-- A fan-out's concurrency semaphore: a sorted set of holders scored by lease expiry (ms, Redis
-- server time, so hosts' clocks do not matter). Expired holders (a worker that died while
-- running a subagent) are dropped before anyone counts the slots.
-- KEYS[1] slots: holder -> lease expiry (sorted set)
-- KEYS[2] wake: a list; a release pushes one token, for a subagent waiting for a slot (BLPOP)
-- ARGV[1] op: "acquire" | "renew" | "release"
-- ARGV[2] holder: the holder
-- ARGV[3] limit: the number of slots
-- ARGV[4] lease_ms: a slot's lease
-- ARGV[5] ttl_ms: the key's ttl
-- Returns 1 when the holder has a slot (acquired or renewed) or released it, 0 otherwise.
redis.replicate_commands()
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local op, holder = ARGV[1], ARGV[2]
if op == "release" then
  if redis.call("ZREM", KEYS[1], holder) == 1 then
    redis.call("RPUSH", KEYS[2], "1")
    redis.call("PEXPIRE", KEYS[2], tonumber(ARGV[5]))
  end
  return 1
end
redis.call("ZREMRANGEBYSCORE", KEYS[1], "-inf", now)
local held = redis.call("ZSCORE", KEYS[1], holder)
if op == "renew" and not held then
  return 0
end
if held or redis.call("ZCARD", KEYS[1]) < tonumber(ARGV[3]) then
  redis.call("ZADD", KEYS[1], now + tonumber(ARGV[4]), holder)
  redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[5]))
  return 1
end
return 0
