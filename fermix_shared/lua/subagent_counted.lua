-- The chord counted a subagent's report: the reaper stops watching the subagent.
-- KEYS[1] run: the subagent's run hash
-- KEYS[2] running: "fanout:index" -> worker, every subagent being run
-- ARGV[1] member: "fanout:index"
-- Returns 1 when it was forgotten, 0 when it had not finished (another execution runs it).
if redis.call("HGET", KEYS[1], "state") ~= "done" then
  return 0
end
redis.call("HDEL", KEYS[2], ARGV[1])
return 1
