-- Delete one fact for good (memory_forget), whatever its status.
-- KEYS[1] facts: id -> fact JSON (hash)
-- KEYS[2] active: active fact ids by change number (zset)
-- KEYS[3] archived: archived fact ids by change number (zset)
-- KEYS[4] text_index: normalized text -> id (hash)
-- ARGV[1] fact_id: the fact's id
-- ARGV[2] text: its normalized text
-- Returns 1 if it existed, else 0.
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if redis.call('HGET', KEYS[4], ARGV[2]) == ARGV[1] then
  redis.call('HDEL', KEYS[4], ARGV[2])
end
return 1
