-- Claim the conversation: at most one active turn per key, fleet-wide.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] inbox: the conversation's inbox list
-- KEYS[3] active_index: conversation -> lease expiry
-- KEYS[4] queued_index: conversation -> waiting since
-- ARGV[1] worker: the claiming worker
-- ARGV[2] lease_ms: the lease
-- ARGV[3] now_ms: now, in ms
-- ARGV[4] conv: the conversation key
-- ARGV[5] collect: "1" to take every pending message at once (collect mode)
-- Returns {"busy"} | {"empty"} | {"claimed", message, ...more merged messages}
--       | {"orphan", message, cancelled-reason-or-"", attempt}
-- "orphan": the previous holder's lease lapsed (it died); the caller now holds that turn, as
-- its attempt number `attempt` (2 for the first recovery), and must resume or close it before
-- anything else runs.
local now = tonumber(ARGV[3])
local lease_until = now + tonumber(ARGV[2])
if redis.call("EXISTS", KEYS[1]) == 1 then
  local until_ms = tonumber(redis.call("HGET", KEYS[1], "lease_until") or "0")
  if until_ms > now then
    return {"busy"}
  end
  redis.call("HSET", KEYS[1], "worker", ARGV[1], "lease_until", lease_until)
  local attempt = redis.call("HINCRBY", KEYS[1], "attempt", 1)
  redis.call("ZADD", KEYS[3], lease_until, ARGV[4])
  return {"orphan", redis.call("HGET", KEYS[1], "message"),
          redis.call("HGET", KEYS[1], "cancelled") or "", attempt}
end
local taken
if ARGV[5] == "1" then
  -- Collect: every waiting message, up to a compaction job (which runs on its own).
  taken = {}
  for _, raw in ipairs(redis.call("LRANGE", KEYS[2], 0, -1)) do
    local is_job = cjson.decode(raw)["kind"] == "compact"
    if is_job and #taken > 0 then break end
    taken[#taken + 1] = raw
    if is_job then break end
  end
  if #taken > 0 then redis.call("LTRIM", KEYS[2], #taken, -1) end
else
  local head = redis.call("LPOP", KEYS[2])
  taken = head and {head} or {}
end
if #taken == 0 then
  -- No active turn and nothing waiting: neither index may name the conversation (a stale
  -- active_index entry would have the reaper recover it on every scan).
  redis.call("ZREM", KEYS[4], ARGV[4])
  redis.call("ZREM", KEYS[3], ARGV[4])
  return {"empty"}
end
if redis.call("LLEN", KEYS[2]) == 0 then
  redis.call("ZREM", KEYS[4], ARGV[4])
else
  redis.call("ZADD", KEYS[4], now, ARGV[4])
end
local first = cjson.decode(taken[1])
redis.call("HSET", KEYS[1], "turn_id", first["run_id"], "worker", ARGV[1],
  "lease_until", lease_until, "message", taken[1], "attempt", 1)
redis.call("ZADD", KEYS[3], lease_until, ARGV[4])
local out = {"claimed"}
for i = 1, #taken do out[#out + 1] = taken[i] end
return out
