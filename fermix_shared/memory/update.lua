-- Compare-and-set one fact: replace its text (status "active") or archive it.
-- KEYS: facts (hash), active (zset), archived (zset), text index (hash)
-- ARGV: id, expected JSON, new JSON, old normalized text, new normalized text, new status,
--       change number, cap on archived facts (the oldest beyond it are deleted)
-- Returns "conflict" (the fact changed since it was read), "dup" (another active fact already
-- says the new text) or "ok".
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 'conflict'
end
if ARGV[6] == 'active' then
  local owner = redis.call('HGET', KEYS[4], ARGV[5])
  if owner and owner ~= ARGV[1] and redis.call('ZSCORE', KEYS[2], owner) then
    return 'dup'
  end
end
if redis.call('HGET', KEYS[4], ARGV[4]) == ARGV[1] then
  redis.call('HDEL', KEYS[4], ARGV[4])
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
if ARGV[6] == 'active' then
  redis.call('HSET', KEYS[4], ARGV[5], ARGV[1])
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[1])
  return 'ok'
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[7], ARGV[1])
local over = redis.call('ZCARD', KEYS[3]) - tonumber(ARGV[8])
if over > 0 then
  local oldest = redis.call('ZRANGE', KEYS[3], 0, over - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[3], 0, over - 1)
  redis.call('HDEL', KEYS[1], unpack(oldest))
end
return 'ok'
