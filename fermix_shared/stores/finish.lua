-- Close a turn: compare-and-commit, then release the conversation, in one step.
-- KEYS[1] active hash, KEYS[2] inbox, KEYS[3] run record, KEYS[4] history list
-- ARGV[1] turn id, ARGV[2] worker, ARGV[3] final run record JSON, ARGV[4] run ttl s,
-- ARGV[5] history cap, ARGV[6..] history entries to append (none for a turn that failed)
-- Returns the inbox length (>= 0) when closed, -1 when this worker no longer holds the turn
-- (it is fenced: nothing is written).
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "worker") ~= ARGV[2] then
  return -1
end
redis.call("SET", KEYS[3], ARGV[3], "EX", tonumber(ARGV[4]))
if #ARGV > 5 then
  for i = 6, #ARGV do
    redis.call("RPUSH", KEYS[4], ARGV[i])
  end
  redis.call("LTRIM", KEYS[4], -tonumber(ARGV[5]), -1)
end
redis.call("DEL", KEYS[1])
return redis.call("LLEN", KEYS[2])
