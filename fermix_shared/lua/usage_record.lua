-- Count one model call in this hour's, day's and month's usage, in every scope it is charged
-- to, and release its budget reservation (fermix_shared/usage/reserve.py) in the same step.
-- KEYS[1] hour: this hour's usage hash
-- KEYS[2] day: today's usage hash
-- KEYS[3] month: this month's usage hash
-- KEYS[4] unpriced: model -> calls counted without a price
-- KEYS[5] reserved: "<scope>|<period>|<bucket>|usd" and "|tok" -> what live reservations hold
-- KEYS[6] reservations: reservation id -> JSON {u: usd, t: tokens, f: [field prefix, ...]}
-- KEYS[7] expiry: zset of reservation ids by the unix time they lapse
-- KEYS[8] rate: agent -> "<minute>:<tokens>" (the token-rate breaker): a call's reservation
--   there is settled to its reported tokens while its minute lasts
-- ARGV[1] input_tokens: provider-reported input tokens (all of them, the cached included)
-- ARGV[2] output_tokens: provider-reported output tokens (the reasoning included)
-- ARGV[3] usd_micros: the call's cost in micro-dollars (0 when unpriced)
-- ARGV[4] unpriced_model: the model that has no price, "" when the call was priced
-- ARGV[5] hour_expire_at: unix time after which the hour's bucket may go
-- ARGV[6] day_expire_at: the same for the day's bucket
-- ARGV[7] month_expire_at: the same for the month's bucket
-- ARGV[8] reservation_id: the call's reservation to release ("" for none)
-- ARGV[9] now: unix time; reservations that lapsed by then are released too (at most 100)
-- ARGV[10] count: "1" to count the call, "0" to release only (a call that failed)
-- ARGV[11] cache_read: the part of input_tokens read from the prompt cache
-- ARGV[12] cache_write: the part of input_tokens written to the prompt cache
-- ARGV[13] reasoning: the part of output_tokens spent reasoning
-- ARGV[14..] scopes: the scopes charged (total, agent:..., conversation:..., user:...)
-- Fields are "<metric>:<scope>" (in, out, calls, usd, unpriced, cread, cwrite, reason).
-- A reservation is released once (a second release finds nothing). Returns how many
-- reservations were released.
local function release(id)
  local raw = redis.call('HGET', KEYS[6], id)
  redis.call('ZREM', KEYS[7], id)
  if not raw then return 0 end
  redis.call('HDEL', KEYS[6], id)
  local res = cjson.decode(raw)
  if res.a and res.a ~= '' then
    local minute, used = string.match(redis.call('HGET', KEYS[8], res.a) or '', '^(%d+):(%d+)$')
    if minute == res.m then
      local actual = 0
      if id == ARGV[8] and ARGV[10] == '1' then actual = tonumber(ARGV[1]) + tonumber(ARGV[2]) end
      redis.call('HSET', KEYS[8], res.a, minute .. ':' .. math.max(0, tonumber(used) - res.t + actual))
    end
  end
  for _, prefix in ipairs(res.f) do
    for _, m in ipairs({{'|usd', res.u}, {'|tok', res.t}}) do
      if m[2] > 0 and redis.call('HINCRBY', KEYS[5], prefix .. m[1], -m[2]) <= 0 then
        redis.call('HDEL', KEYS[5], prefix .. m[1])
      end
    end
  end
  return 1
end
local released = 0
if ARGV[8] ~= '' then released = release(ARGV[8]) end
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[7], '-inf', tonumber(ARGV[9]), 'LIMIT', 0, 100)) do
  released = released + release(id)
end
if ARGV[10] ~= '1' then return released end
local input = tonumber(ARGV[1])
local output = tonumber(ARGV[2])
local usd = tonumber(ARGV[3])
local unpriced = ARGV[4]
local parts = {{'cread:', tonumber(ARGV[11])}, {'cwrite:', tonumber(ARGV[12])},
               {'reason:', tonumber(ARGV[13])}}
local buckets = {{KEYS[1], ARGV[5]}, {KEYS[2], ARGV[6]}, {KEYS[3], ARGV[7]}}
-- What one bucket gains, field by field, in a first-seen order (a scope named twice counts
-- twice, as it did when each field had its own HINCRBY).
local fields, gains = {}, {}
local function gain(field, n)
  if n == 0 then return end
  if gains[field] == nil then fields[#fields + 1] = field; gains[field] = 0 end
  gains[field] = gains[field] + n
end
for i = 14, #ARGV do
  local scope = ARGV[i]
  gain('calls:' .. scope, 1)
  gain('in:' .. scope, input)
  gain('out:' .. scope, output)
  gain('usd:' .. scope, usd)
  if unpriced ~= '' then gain('unpriced:' .. scope, 1) end
  for _, part in ipairs(parts) do gain(part[1] .. scope, part[2]) end
end
-- Each bucket is read once (HMGET) and written once (HSET of every field): three commands a
-- bucket, not one HINCRBY a field (75 for five scopes). The sums are exact to 2^53 (Lua's
-- numbers): 9 billion dollars in micro-dollars, 9e15 tokens, in one bucket.
if #fields > 0 then
  for _, bucket in ipairs(buckets) do
    local key = bucket[1]
    local old = redis.call('HMGET', key, unpack(fields))
    local pairs_ = {}
    for j, field in ipairs(fields) do
      pairs_[#pairs_ + 1] = field
      pairs_[#pairs_ + 1] = string.format('%d', (tonumber(old[j]) or 0) + gains[field])
    end
    redis.call('HSET', key, unpack(pairs_))
    redis.call('EXPIREAT', key, bucket[2])
  end
end
if unpriced ~= '' then redis.call('HINCRBY', KEYS[4], unpriced, 1) end
return released
