-- Take the messages steered into the active turn, if this turn still holds the conversation.
-- KEYS[1] active: the active-turn hash
-- KEYS[2] steer: the steer list
-- ARGV[1] turn_id: the turn's id
-- ARGV[2] worker: the worker holding it
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return {}
end
local items = redis.call("LRANGE", KEYS[2], 0, -1)
redis.call("DEL", KEYS[2])
return items
