-- Claim the conversation: at most one active turn per key, fleet-wide.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] inbox: the conversation's inbox list
-- KEYS[3] active_index: conversation -> lease expiry
-- KEYS[4] queued_index: conversation -> waiting since
-- KEYS[5] paused: agent -> paused at (ms)
-- KEYS[6] held: conversation -> the paused agent its inbox head waits for
-- KEYS[7] last_active: agent -> when a turn of it last started or ended (ms)
-- KEYS[8] mode: the conversation's own queue mode (/queue MODE), overriding ARGV[5]
-- ARGV[1] worker: the claiming worker
-- ARGV[2] lease_ms: the lease
-- ARGV[3] now_ms: now, in ms
-- ARGV[4] conv: the conversation key
-- ARGV[5] collect: "1" when the channel's mode is collect (take every pending message at
--   once); the conversation's own mode, when it has a known one, decides instead
-- Returns {"busy"} | {"empty"} | {"paused", agent} | {"claimed", message, ...more merged}
--       | {"orphan", message, cancelled-reason-or-"", attempt}
-- "orphan": the previous holder's lease lapsed (it died); the caller now holds that turn, as
-- its attempt number `attempt` (2 for the first recovery), and must resume or close it before
-- anything else runs. A pause never holds an orphan: a turn that started finishes.
-- "paused": the inbox head is a message for a paused agent. Nothing is taken; the conversation
-- is recorded in `held` (and stays in queued_index) for the resume to dispatch it again. This
-- check and resume's release are each one step, so no wake-up is lost between them.
local own_mode = redis.call("GET", KEYS[8])
local collect = ARGV[5] == "1"
if own_mode == "collect" then
  collect = true
elseif own_mode == "followup" or own_mode == "steer" or own_mode == "interrupt"
    or own_mode == "reject" then
  collect = false
end
local now = tonumber(ARGV[3])
local lease_until = now + tonumber(ARGV[2])
local function agent_of(msg)
  return msg["agent"] or "default"
end
local function is_job(msg)
  return msg["kind"] == "compact"
end
if redis.call("EXISTS", KEYS[1]) == 1 then
  local until_ms = tonumber(redis.call("HGET", KEYS[1], "lease_until") or "0")
  if until_ms > now then
    return {"busy"}
  end
  redis.call("HSET", KEYS[1], "worker", ARGV[1], "lease_until", lease_until)
  local attempt = redis.call("HINCRBY", KEYS[1], "attempt", 1)
  redis.call("ZADD", KEYS[3], lease_until, ARGV[4])
  local message = redis.call("HGET", KEYS[1], "message")
  local ok, msg = pcall(cjson.decode, message or "")
  if ok and type(msg) == "table" and not is_job(msg) then
    redis.call("HSET", KEYS[7], agent_of(msg), now)
  end
  return {"orphan", message, redis.call("HGET", KEYS[1], "cancelled") or "", attempt}
end
local head_raw = redis.call("LINDEX", KEYS[2], 0)
if not head_raw then
  -- No active turn and nothing waiting: neither index may name the conversation (a stale
  -- active_index entry would have the reaper recover it on every scan).
  redis.call("ZREM", KEYS[4], ARGV[4])
  redis.call("ZREM", KEYS[3], ARGV[4])
  redis.call("HDEL", KEYS[6], ARGV[4])
  return {"empty"}
end
local head = cjson.decode(head_raw)
local agent = agent_of(head)
if not is_job(head) and redis.call("HEXISTS", KEYS[5], agent) == 1 then
  redis.call("HSET", KEYS[6], ARGV[4], agent)
  redis.call("ZREM", KEYS[3], ARGV[4])
  redis.call("ZADD", KEYS[4], "NX", now, ARGV[4])
  return {"paused", agent}
end
redis.call("HDEL", KEYS[6], ARGV[4])
local taken
if collect then
  -- Collect: the waiting messages of the head's agent, up to a compaction job (which runs on
  -- its own) or a message for another agent (a turn answers as one agent).
  taken = {head_raw}
  if not is_job(head) then
    for i, raw in ipairs(redis.call("LRANGE", KEYS[2], 1, -1)) do
      local msg = cjson.decode(raw)
      if is_job(msg) or agent_of(msg) ~= agent then break end
      taken[i + 1] = raw
    end
  end
  redis.call("LTRIM", KEYS[2], #taken, -1)
else
  redis.call("LPOP", KEYS[2])
  taken = {head_raw}
end
if redis.call("LLEN", KEYS[2]) == 0 then
  redis.call("ZREM", KEYS[4], ARGV[4])
else
  redis.call("ZADD", KEYS[4], now, ARGV[4])
end
if not is_job(head) then
  redis.call("HSET", KEYS[7], agent, now)
end
redis.call("HSET", KEYS[1], "turn_id", head["run_id"], "worker", ARGV[1],
  "lease_until", lease_until, "message", head_raw, "attempt", 1)
redis.call("ZADD", KEYS[3], lease_until, ARGV[4])
local out = {"claimed"}
for i = 1, #taken do out[#out + 1] = taken[i] end
return out
