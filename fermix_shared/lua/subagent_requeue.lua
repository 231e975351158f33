-- The reaper takes a subagent back from a worker that stopped beating, to publish its header
-- task again under the same task id (the chord then counts the re-run's report as that
-- task's). A subagent that finished but whose report the chord may not have counted (its
-- worker died in between) is published again too: the re-run returns the stored report. A
-- re-run that nobody started within again_ms is published again. A parked subagent (waiting
-- for an approval) is watched as a running one: its re-run takes the parked state.
-- KEYS[1] run: the subagent's run hash
-- KEYS[2] running: "fanout:index" -> worker, every subagent being run
-- KEYS[3] beats: worker process -> last heartbeat (ms, Redis server time)
-- ARGV[1] member: "fanout:index"
-- ARGV[2] dead_ms: silence after which a worker is dead
-- ARGV[3] again_ms: how long a published re-run may wait before it is published again
-- Returns the message to publish (JSON), or "" when there is nothing to do.
redis.replicate_commands()
local state = redis.call("HGET", KEYS[1], "state")
if state ~= "running" and state ~= "parked" and state ~= "requeued" and state ~= "done" then
  -- Gone with its fan-out: nothing to watch any more.
  redis.call("HDEL", KEYS[2], ARGV[1])
  return ""
end
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local owner = redis.call("HGET", KEYS[1], "worker") or ""
if owner ~= "" then
  local beat = tonumber(redis.call("HGET", KEYS[3], owner) or "")
  if not beat or now - beat < tonumber(ARGV[2]) then
    return ""
  end
elseif now - tonumber(redis.call("HGET", KEYS[1], "requeued_at") or "0") < tonumber(ARGV[3]) then
  return ""
end
if state == "running" or state == "parked" then
  redis.call("HSET", KEYS[1], "state", "requeued", "token", "")
  redis.call("HDEL", KEYS[1], "park_token")
end
redis.call("HSET", KEYS[1], "worker", "", "requeued_at", now)
redis.call("HSET", KEYS[2], ARGV[1], "requeued")
return redis.call("HGET", KEYS[1], "message")
