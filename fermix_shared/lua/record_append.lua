-- The flight recorder (fermix_shared/recorder/store.py): append one entry to a run's record,
-- unless the record would pass its size cap; then one "cut" entry marks where it stopped and
-- nothing more is kept for the run.
-- KEYS[1] record: list of JSON entries, oldest first
-- KEYS[2] size: string, the bytes the record holds ("cut" once capped)
-- ARGV[1] entry: the entry's JSON
-- ARGV[2] max_bytes: the record's cap
-- ARGV[3] ttl_s: how long the record is kept after its last write
-- ARGV[4] cut: the JSON of the entry that marks a cut record
-- Returns 1 when the entry was kept, 0 when the record was (or now is) cut.
local size = redis.call("GET", KEYS[2])
if size == "cut" then
  return 0
end
local ttl = tonumber(ARGV[3])
local total = tonumber(size or "0") + string.len(ARGV[1])
if total > tonumber(ARGV[2]) then
  redis.call("RPUSH", KEYS[1], ARGV[4])
  redis.call("SET", KEYS[2], "cut", "EX", ttl)
  redis.call("EXPIRE", KEYS[1], ttl)
  return 0
end
redis.call("RPUSH", KEYS[1], ARGV[1])
redis.call("SET", KEYS[2], total, "EX", ttl)
redis.call("EXPIRE", KEYS[1], ttl)
return 1
