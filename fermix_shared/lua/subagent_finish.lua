-- A subagent's run records its report, if it still holds the subagent; a run the reaper took
-- over (its worker was silent too long) records nothing, so one report counts. The subagent
-- stays in `running` until the chord has counted the report (see subagent_counted), so that a
-- worker dying in between still gets the stored report re-published.
-- KEYS[1] run: the subagent's run hash
-- ARGV[1] token: the execution that ran it
-- ARGV[2] report: its report (JSON)
-- Returns 1 when recorded, 0 when another execution holds the subagent.
if redis.call("HGET", KEYS[1], "token") ~= ARGV[1] then
  return 0
end
redis.call("HSET", KEYS[1], "state", "done", "report", ARGV[2], "token", "")
return 1
