-- Compare-and-mark before an external delivery (a platform send that cannot be undone).
-- KEYS[1] active: the active-turn hash
-- ARGV[1] turn_id: the turn's id
-- ARGV[2] worker: the worker holding it
-- Returns 1 when this turn may deliver (marked "delivering": /stop no longer cancels it),
-- -1 when fenced (another worker holds the conversation), -2 when cancelled.
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return -1
end
if redis.call("HGET", KEYS[1], "cancelled") then
  return -2
end
redis.call("HSET", KEYS[1], "delivering", "1")
return 1
