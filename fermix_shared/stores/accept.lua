-- Accept one inbound message: de-duplicate, create its run record, queue it. All or nothing,
-- before the request is answered.
-- KEYS[1] dedupe mark (the run key again when there is none), KEYS[2] inbox, KEYS[3] run record,
-- KEYS[4] active hash, KEYS[5] steer list, KEYS[6] queued index
-- ARGV[1] run id, ARGV[2] message JSON, ARGV[3] run record JSON, ARGV[4] dedupe ttl s,
-- ARGV[5] run ttl s, ARGV[6] "1" when KEYS[1] is a real dedupe mark, ARGV[7] queue mode,
-- ARGV[8] conversation key, ARGV[9] now ms
-- Returns {run_id, code}: 1 queued, 0 duplicate (run_id is the first run's), 2 refused
-- (reject mode and the conversation is busy), 3 steered into the active turn.
if ARGV[6] == "1" then
  local first = redis.call("GET", KEYS[1])
  if first then
    return {first, 0}
  end
end
local mode = ARGV[7]
local busy = redis.call("EXISTS", KEYS[4]) == 1
if mode == "reject" and (busy or redis.call("LLEN", KEYS[2]) > 0) then
  return {"", 2}
end
if ARGV[6] == "1" then
  redis.call("SET", KEYS[1], ARGV[1], "EX", tonumber(ARGV[4]))
end
redis.call("SET", KEYS[3], ARGV[3], "EX", tonumber(ARGV[5]))
if mode == "steer" and busy and not redis.call("HGET", KEYS[4], "cancelled") then
  redis.call("RPUSH", KEYS[5], ARGV[2])
  return {ARGV[1], 3}
end
redis.call("RPUSH", KEYS[2], ARGV[2])
redis.call("ZADD", KEYS[6], "NX", tonumber(ARGV[9]), ARGV[8])
return {ARGV[1], 1}
