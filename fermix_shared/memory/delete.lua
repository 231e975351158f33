-- Delete one fact for good (memory_forget), whatever its status.
-- KEYS: facts (hash), active (zset), archived (zset), text index (hash)
-- ARGV: id, its normalized text
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
