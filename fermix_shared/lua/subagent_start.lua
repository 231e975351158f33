-- A header task takes its subagent to run, unless the subagent already reported or is being
-- run by a live worker (this is a duplicate: the broker's redelivery, or a re-run the reaper
-- published for a worker that was only slow). A subagent whose worker stopped beating, or one
-- the reaper re-published, is taken over. A parked subagent (waiting for an approval) is
-- taken by its park's own retry (park_token), or like a running one when its worker died; the
-- taker gets the parked state, which leaves the hash (a crash from here re-runs it afresh).
-- KEYS[1] run: the subagent's run hash {state, worker, token, message, report, parked, ...}
-- KEYS[2] running: "fanout:index" -> worker, every subagent being run
-- KEYS[3] beats: worker process -> last heartbeat (ms, Redis server time)
-- ARGV[1] member: "fanout:index"
-- ARGV[2] worker: this worker process
-- ARGV[3] token: this execution of the header task
-- ARGV[4] message: what re-publishing the header task takes (JSON)
-- ARGV[5] dead_ms: silence after which a worker is dead
-- ARGV[6] ttl_ms: the run hash's ttl (the fan-out's)
-- ARGV[7] park_token: the park this execution is the retry of ("" when none)
-- Returns {"run", parked} | {"done", report} | {"busy"}; parked: the parked state or ""
redis.replicate_commands()
local state = redis.call("HGET", KEYS[1], "state")
if state == "done" then
  return {"done", redis.call("HGET", KEYS[1], "report")}
end
local own_park = state == "parked" and ARGV[7] ~= ""
  and redis.call("HGET", KEYS[1], "park_token") == ARGV[7]
if (state == "running" or state == "parked") and not own_park then
  -- A worker without a beat is not known to be dead (it may not write one): it holds on.
  local beat = tonumber(redis.call("HGET", KEYS[3], redis.call("HGET", KEYS[1], "worker")) or "")
  local t = redis.call("TIME")
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if not beat or now - beat < tonumber(ARGV[5]) then
    return {"busy"}
  end
end
redis.call("HSET", KEYS[1], "state", "running", "worker", ARGV[2], "token", ARGV[3],
  "message", ARGV[4])
local parked = redis.call("HGET", KEYS[1], "parked") or ""
redis.call("HDEL", KEYS[1], "park_token", "parked")
redis.call("PEXPIRE", KEYS[1], tonumber(ARGV[6]))
redis.call("HSET", KEYS[2], ARGV[1], ARGV[2])
return {"run", parked}
