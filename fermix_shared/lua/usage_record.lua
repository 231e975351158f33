-- Count one model call in this hour's, day's and month's usage, in every scope it is charged to.
-- KEYS[1] hour: this hour's usage hash
-- KEYS[2] day: today's usage hash
-- KEYS[3] month: this month's usage hash
-- KEYS[4] unpriced: model -> calls counted without a price
-- ARGV[1] input_tokens: provider-reported input tokens
-- ARGV[2] output_tokens: provider-reported output tokens
-- ARGV[3] usd_micros: the call's cost in micro-dollars (0 when unpriced)
-- ARGV[4] unpriced_model: the model that has no price, "" when the call was priced
-- ARGV[5] hour_expire_at: unix time after which the hour's bucket may go
-- ARGV[6] day_expire_at: the same for the day's bucket
-- ARGV[7] month_expire_at: the same for the month's bucket
-- ARGV[8..] scopes: the scopes charged (total, agent:..., conversation:..., user:...)
-- Fields are "<metric>:<scope>" (in, out, calls, usd, unpriced). Returns the scopes counted.
local input = tonumber(ARGV[1])
local output = tonumber(ARGV[2])
local usd = tonumber(ARGV[3])
local unpriced = ARGV[4]
local buckets = {{KEYS[1], ARGV[5]}, {KEYS[2], ARGV[6]}, {KEYS[3], ARGV[7]}}
for _, bucket in ipairs(buckets) do
  local key = bucket[1]
  for i = 8, #ARGV do
    local scope = ARGV[i]
    redis.call('HINCRBY', key, 'calls:' .. scope, 1)
    if input ~= 0 then redis.call('HINCRBY', key, 'in:' .. scope, input) end
    if output ~= 0 then redis.call('HINCRBY', key, 'out:' .. scope, output) end
    if usd ~= 0 then redis.call('HINCRBY', key, 'usd:' .. scope, usd) end
    if unpriced ~= '' then redis.call('HINCRBY', key, 'unpriced:' .. scope, 1) end
  end
  redis.call('EXPIREAT', key, bucket[2])
end
if unpriced ~= '' then redis.call('HINCRBY', KEYS[4], unpriced, 1) end
return #ARGV - 7
