-- Compare-and-mark before an external delivery (a platform send that cannot be undone).
-- KEYS[1] active: the active-turn hash
-- ARGV[1] turn_id: the turn's id
-- ARGV[2] worker: the worker holding it
-- ARGV[3] mark: the "delivering" field's value: "1", or under a durability wait the
--         primary's replication id as the worker last read it (Lua cannot read INFO), so a
--         recovered turn can tell whether a failover came between (fermix_shared/sentinel.py)
-- Returns 1 when this turn may deliver (marked "delivering": /stop no longer cancels it),
-- -1 when fenced (another worker holds the conversation), -2 when cancelled.
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return -1
end
if redis.call("HGET", KEYS[1], "cancelled") then
  return -2
end
redis.call("HSET", KEYS[1], "delivering", ARGV[3])
return 1
