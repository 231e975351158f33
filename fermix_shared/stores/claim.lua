-- Claim the conversation: at most one active turn per key, fleet-wide.
-- KEYS[1] active hash, KEYS[2] inbox list
-- ARGV[1] worker name, ARGV[2] lease ms, ARGV[3] now ms
-- Returns {"busy"} | {"empty"} | {"claimed", message} | {"orphan", message}
-- "orphan": the previous holder's lease lapsed (it died); the caller now holds that turn and
-- must close it before anything else runs.
local turn = redis.call("HGET", KEYS[1], "turn_id")
local now = tonumber(ARGV[3])
local lease_until = now + tonumber(ARGV[2])
if turn then
  local until_ms = tonumber(redis.call("HGET", KEYS[1], "lease_until") or "0")
  if until_ms > now then
    return {"busy"}
  end
  redis.call("HSET", KEYS[1], "worker", ARGV[1], "lease_until", lease_until)
  return {"orphan", redis.call("HGET", KEYS[1], "message")}
end
local head = redis.call("LPOP", KEYS[2])
if not head then
  return {"empty"}
end
local msg = cjson.decode(head)
redis.call("HSET", KEYS[1], "turn_id", msg["run_id"], "worker", ARGV[1],
  "lease_until", lease_until, "message", head)
return {"claimed", head}
