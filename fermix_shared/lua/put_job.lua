-- Compare-and-set one scheduled job: its record, its place in the due index and, optionally,
-- one more entry of its run history. Nothing is written unless the stored record is the one
-- the caller read, so two schedulers (or a scheduler and the CLI) never both act on one state.
-- KEYS[1] jobs: the jobs hash
-- KEYS[2] due: the due sorted set
-- KEYS[3] runs: the job's run history list
-- ARGV[1] name: the job's name
-- ARGV[2] expected: the expected record: "" = the job must not exist, "*" = whatever is
--         stored, else the exact JSON the caller read
-- ARGV[3] record: the new record JSON, or "" to delete the job (and its history)
-- ARGV[4] next_run_ms: the next run for the due index, or "" to take the job out of it
-- ARGV[5] run: a run history entry JSON to prepend, or ""
-- ARGV[6] runs_cap: run history entries kept
-- Returns 1 when written, 0 when the stored record was not the expected one.
local current = redis.call("HGET", KEYS[1], ARGV[1])
if ARGV[2] == "" then
  if current then
    return 0
  end
elseif ARGV[2] ~= "*" and current ~= ARGV[2] then
  return 0
end
if ARGV[3] == "" then
  redis.call("HDEL", KEYS[1], ARGV[1])
  redis.call("ZREM", KEYS[2], ARGV[1])
  redis.call("DEL", KEYS[3])
  return 1
end
redis.call("HSET", KEYS[1], ARGV[1], ARGV[3])
if ARGV[4] == "" then
  redis.call("ZREM", KEYS[2], ARGV[1])
else
  redis.call("ZADD", KEYS[2], tonumber(ARGV[4]), ARGV[1])
end
if ARGV[5] ~= "" then
  redis.call("LPUSH", KEYS[3], ARGV[5])
  redis.call("LTRIM", KEYS[3], 0, tonumber(ARGV[6]) - 1)
end
return 1
