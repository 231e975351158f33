-- Compaction: replace the first N history entries with one checkpoint entry, if the history
-- still starts with them (its length is at least N and entry N-1 is unchanged).
-- KEYS[1] history: the conversation's history list
-- ARGV[1] prefix_len: N
-- ARGV[2] prefix_last: the expected entry at index N-1
-- ARGV[3] checkpoint: the checkpoint entry
-- Returns 1 when replaced, 0 when the history changed meanwhile (nothing written).
local n = tonumber(ARGV[1])
if redis.call("LLEN", KEYS[1]) < n or redis.call("LINDEX", KEYS[1], n - 1) ~= ARGV[2] then
  return 0
end
redis.call("LTRIM", KEYS[1], n, -1)
redis.call("LPUSH", KEYS[1], ARGV[3])
return 1
