-- Reserve a model call's worst case against every budget of its scopes, or refuse it.
-- KEYS[1] hour: this hour's usage hash (spent: in/out/usd per scope)
-- KEYS[2] day: today's usage hash
-- KEYS[3] month: this month's usage hash
-- KEYS[4] budgets: "<scope>|<period>" -> JSON Budget (usd_micros, tokens)
-- KEYS[5] reserved: "<scope>|<period>|<bucket>|usd" and "|tok" -> what live reservations hold
-- KEYS[6] reservations: reservation id -> JSON {u: usd, t: tokens, f: [field prefix, ...]}
-- KEYS[7] expiry: zset of reservation ids by the unix time they lapse (a crashed caller's)
-- KEYS[8] rate: agent -> "<minute>:<tokens>", what its calls reserved (settled: used) in that
--   UTC minute (the token-rate breaker, fermix_shared/usage/rate.py)
-- ARGV[1] reservation_id: this call's id
-- ARGV[2] usd_micros: the call's worst-case cost
-- ARGV[3] tokens: the call's worst-case tokens (input as sent plus max_tokens)
-- ARGV[4] expires_at: when this reservation lapses if never settled
-- ARGV[5] hour_bucket: this hour's bucket id
-- ARGV[6] day_bucket: today's bucket id
-- ARGV[7] month_bucket: this month's bucket id
-- ARGV[8] rate_agent: the agent whose tokens per minute are limited ("" for no limit)
-- ARGV[9] rate_limit: its tokens per minute
-- ARGV[10] minute: this UTC minute (unix time // 60)
-- ARGV[11..] scopes: the scopes the call is charged to
-- Every budget on a scope in a period must have room for spent + reserved + this call, and
-- the agent's minute for its tokens (a minute with nothing counted yet takes any one call);
-- then the call is reserved where a budget or the rate applies (usage_record releases it).
-- Returns {1} when reserved (or when nothing applies), {0, scope, period} for the budget that
-- refused, {2, tokens} when the agent's rate refused (what its minute holds already).
local usd = tonumber(ARGV[2])
local tokens = tonumber(ARGV[3])
local periods = {{'hour', KEYS[1], ARGV[5]}, {'day', KEYS[2], ARGV[6]}, {'month', KEYS[3], ARGV[7]}}
local rate_used = nil
if ARGV[8] ~= '' then
  local minute, used = string.match(redis.call('HGET', KEYS[8], ARGV[8]) or '', '^(%d+):(%d+)$')
  rate_used = (minute == ARGV[10]) and tonumber(used) or 0
  if rate_used > 0 and rate_used + tokens > tonumber(ARGV[9]) then return {2, rate_used} end
end
local held = {}
-- Every scope's budget in every period, in one read (one HMGET, not one HGET each).
local names = {}
for i = 11, #ARGV do
  for _, p in ipairs(periods) do names[#names + 1] = ARGV[i] .. '|' .. p[1] end
end
local declared = #names > 0 and redis.call('HMGET', KEYS[4], unpack(names)) or {}
local n = 0
for i = 11, #ARGV do
  local scope = ARGV[i]
  for _, p in ipairs(periods) do
    n = n + 1
    local raw = declared[n]
    if raw then
      local budget = cjson.decode(raw)
      local prefix = scope .. '|' .. p[1] .. '|' .. p[3]
      local spent = redis.call('HMGET', p[2], 'usd:' .. scope, 'in:' .. scope, 'out:' .. scope)
      local rsv = redis.call('HMGET', KEYS[5], prefix .. '|usd', prefix .. '|tok')
      local limit_usd, limit_tok = budget.usd_micros, budget.tokens
      if limit_usd ~= nil and limit_usd ~= cjson.null then
        if (tonumber(spent[1]) or 0) + (tonumber(rsv[1]) or 0) + usd > limit_usd then
          return {0, scope, p[1]}
        end
      end
      if limit_tok ~= nil and limit_tok ~= cjson.null then
        local used = (tonumber(spent[2]) or 0) + (tonumber(spent[3]) or 0)
        if used + (tonumber(rsv[2]) or 0) + tokens > limit_tok then
          return {0, scope, p[1]}
        end
      end
      held[#held + 1] = prefix
    end
  end
end
if rate_used ~= nil then
  redis.call('HSET', KEYS[8], ARGV[8], ARGV[10] .. ':' .. (rate_used + tokens))
end
if #held > 0 or rate_used ~= nil then
  for _, prefix in ipairs(held) do
    if usd > 0 then redis.call('HINCRBY', KEYS[5], prefix .. '|usd', usd) end
    if tokens > 0 then redis.call('HINCRBY', KEYS[5], prefix .. '|tok', tokens) end
  end
  redis.call('HSET', KEYS[6], ARGV[1], cjson.encode({u = usd, t = tokens, f = held, a = ARGV[8], m = ARGV[10]}))
  redis.call('ZADD', KEYS[7], tonumber(ARGV[4]), ARGV[1])
end
return {1}
