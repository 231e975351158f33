-- Compare-and-set one fact: replace its text (status "active") or archive it.
-- KEYS[1] facts: id -> fact JSON (hash)
-- KEYS[2] active: active fact ids by change number (zset)
-- KEYS[3] archived: archived fact ids by change number (zset)
-- KEYS[4] text_index: normalized text -> id (hash)
-- ARGV[1] fact_id: the fact's id
-- ARGV[2] expected: the JSON the caller read
-- ARGV[3] fact: the new JSON
-- ARGV[4] old_text: the old normalized text
-- ARGV[5] new_text: the new normalized text
-- ARGV[6] status: the new status
-- ARGV[7] change: the change number
-- ARGV[8] max_archived: the cap on archived facts (the oldest beyond it are deleted)
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
