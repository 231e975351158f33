-- A subagent's run parks it for a person's approval, if it still holds the subagent: the
-- header task gives its worker back and comes back as the park's own retry (park_token),
-- which takes the parked state (subagent_start). The worker stays recorded as the owner: the
-- reaper re-runs a parked subagent whose worker stopped beating, as a running one.
-- KEYS[1] run: the subagent's run hash
-- ARGV[1] token: the execution that parks it
-- ARGV[2] park_token: what the park's own retry presents to take it back
-- ARGV[3] parked: the parked subagent's state (JSON)
-- Returns 1 when parked, 0 when another execution holds the subagent.
if redis.call("HGET", KEYS[1], "token") ~= ARGV[1] then
  return 0
end
redis.call("HSET", KEYS[1], "state", "parked", "token", "", "park_token", ARGV[2],
  "parked", ARGV[3])
return 1
