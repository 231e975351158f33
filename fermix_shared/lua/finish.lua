-- Close a turn: compare-and-deliver, commit, release the conversation, in one step.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] inbox: the conversation's inbox list
-- KEYS[3] run: the run record
-- KEYS[4] history: the conversation's history list
-- KEYS[5] active_index: conversation -> lease expiry
-- KEYS[6] queued_index: conversation -> waiting since
-- KEYS[7] steer: the steer list
-- KEYS[8] last_active: agent -> when a turn of it last started or ended (ms)
-- ARGV[1] turn_id: the turn's id
-- ARGV[2] worker: the worker holding it
-- ARGV[3] record: the final run record JSON
-- ARGV[4] run_ttl_s: the run record's ttl
-- ARGV[5] history_cap: entries the history keeps
-- ARGV[6] conv: the conversation key
-- ARGV[7] now_ms: now, in ms
-- ARGV[8] mode: "deliver" (refused if the turn was cancelled meanwhile) or "close"
-- ARGV[9..] entries: history entries to append
-- Returns the number of messages now waiting (>= 0); -1 when this worker no longer holds the
-- turn (fenced: nothing written); -2 when a delivery lost the race with a cancellation (nothing
-- written; close the turn as stopped instead).
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return -1
end
if ARGV[8] == "deliver" and redis.call("HGET", KEYS[1], "cancelled") then
  return -2
end
redis.call("SET", KEYS[3], ARGV[3], "EX", tonumber(ARGV[4]))
local ok, msg = pcall(cjson.decode, redis.call("HGET", KEYS[1], "message") or "")
if ok and type(msg) == "table" and msg["kind"] ~= "compact" then
  redis.call("HSET", KEYS[8], msg["agent"] or "default", ARGV[7])
end
if #ARGV > 8 then
  for i = 9, #ARGV do
    redis.call("RPUSH", KEYS[4], ARGV[i])
  end
  redis.call("LTRIM", KEYS[4], -tonumber(ARGV[5]), -1)
end
-- Steering messages the turn did not get to run next, ahead of anything queued.
local steered = redis.call("LRANGE", KEYS[7], 0, -1)
for i = #steered, 1, -1 do
  redis.call("LPUSH", KEYS[2], steered[i])
end
redis.call("DEL", KEYS[7], KEYS[1])
redis.call("ZREM", KEYS[5], ARGV[6])
local waiting = redis.call("LLEN", KEYS[2])
if waiting > 0 then
  redis.call("ZADD", KEYS[6], "NX", tonumber(ARGV[7]), ARGV[6])
end
return waiting
