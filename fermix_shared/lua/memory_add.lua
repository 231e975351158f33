-- Add one active fact, atomically with its de-duplication and the active-fact cap.
-- KEYS[1] facts: id -> fact JSON (hash)
-- KEYS[2] active: active fact ids by change number (zset)
-- KEYS[3] text_index: normalized text -> id (hash)
-- ARGV[1] fact_id: the new fact's id
-- ARGV[2] fact: its JSON
-- ARGV[3] text: its normalized text
-- ARGV[4] change: the change number
-- ARGV[5] max_active: the cap on active facts
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
