-- Accept one inbound message: de-duplicate, create its run record, append it to the inbox.
-- All or nothing, before the request is answered.
-- KEYS[1] dedupe mark ("" slot allowed: pass the run key twice to skip de-duplication)
-- KEYS[2] inbox list, KEYS[3] run record
-- ARGV[1] run id, ARGV[2] message JSON, ARGV[3] run record JSON,
-- ARGV[4] dedupe ttl s, ARGV[5] run ttl s, ARGV[6] "1" when KEYS[1] is a real dedupe mark
-- Returns {run_id, 1} when accepted now, {first_run_id, 0} for a duplicate.
if ARGV[6] == "1" then
  local first = redis.call("GET", KEYS[1])
  if first then
    return {first, 0}
  end
  redis.call("SET", KEYS[1], ARGV[1], "EX", tonumber(ARGV[4]))
end
redis.call("SET", KEYS[3], ARGV[3], "EX", tonumber(ARGV[5]))
redis.call("RPUSH", KEYS[2], ARGV[2])
return {ARGV[1], 1}
