-- Add one active fact, atomically with its de-duplication and the active-fact cap.
-- KEYS: facts (hash), active (zset), text index (hash)
-- ARGV: id, fact JSON, normalized text, change number, cap on active facts
-- Returns {"dup", JSON of the active fact already saying it} | {"full", ""} | {"new", id}
local owner = redis.call('HGET', KEYS[3], ARGV[3])
if owner and redis.call('ZSCORE', KEYS[2], owner) then
  return {'dup', redis.call('HGET', KEYS[1], owner)}
end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[5]) then
  return {'full', ''}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('HSET', KEYS[3], ARGV[3], ARGV[1])
return {'new', ARGV[1]}
