-- /stop (and interrupt): cancel the active turn cooperatively and clear the queue.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] inbox: the conversation's inbox list
-- KEYS[3] queued_index: conversation -> waiting since
-- KEYS[4] steer: the steer list
-- KEYS[5] held: conversation -> the paused agent its inbox head waits for
-- ARGV[1] reason: "stop" | "interrupt"
-- ARGV[2] conv: the conversation key
-- Returns {active turn id or "", cleared message JSON...}
local turn = redis.call("HGET", KEYS[1], "turn_id") or ""
-- A turn already delivering its reply cannot be taken back: it finishes.
if turn ~= "" and not redis.call("HGET", KEYS[1], "cancelled")
   and not redis.call("HGET", KEYS[1], "delivering") then
  redis.call("HSET", KEYS[1], "cancelled", ARGV[1])
elseif turn ~= "" then
  turn = ""
end
local out = {turn}
for _, key in ipairs({KEYS[4], KEYS[2]}) do
  for _, m in ipairs(redis.call("LRANGE", key, 0, -1)) do out[#out + 1] = m end
end
redis.call("DEL", KEYS[2], KEYS[4])
redis.call("ZREM", KEYS[3], ARGV[2])
redis.call("HDEL", KEYS[5], ARGV[2])
return out
