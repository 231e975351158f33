-- Accept one inbound message: de-duplicate, apply the limits, create its run record, queue it.
-- All or nothing, before the request is answered.
-- KEYS[1] mark: the dedupe mark (the run key again when there is none)
-- KEYS[2] inbox: the conversation's inbox list
-- KEYS[3] run: the run record
-- KEYS[4] active: the active-turn hash
-- KEYS[5] steer: the steer list
-- KEYS[6] queued_index: conversation -> waiting since
-- KEYS[7] sender_rate: the sender's rate state (the run key again when there is no rate limit)
-- KEYS[8] paused: agent -> paused at (ms)
-- KEYS[9] held: conversation -> the paused agent its inbox head waits for
-- KEYS[10] conversations: conversation -> its last accepted message (ms): every conversation
-- KEYS[11] conversation_agents: conversation -> the agent of its last accepted message
-- KEYS[12] conv_runs: the conversation's runs -> accepted at (ms), the newest 50 kept
-- ARGV[1] run_id: the message's run id
-- ARGV[2] message: the message JSON
-- ARGV[3] record: the run record JSON
-- ARGV[4] dedupe_ttl_s: the dedupe mark's ttl
-- ARGV[5] run_ttl_s: the run record's ttl
-- ARGV[6] has_mark: "1" when KEYS[1] is a real dedupe mark
-- ARGV[7] mode: the queue mode
-- ARGV[8] conv: the conversation key
-- ARGV[9] now_ms: now, in ms
-- ARGV[10] max_queued: messages that may wait in the conversation (inbox + steer; 0 = no cap)
-- ARGV[11] rate_count: messages the sender may queue per rate_period_ms (0 = no limit)
-- ARGV[12] rate_period_ms: the rate limit's period, in ms
-- ARGV[13] agent: the agent the message is for
-- Returns {run_id, code}: 1 queued, 0 duplicate (run_id is the first run's), 2 refused
-- (reject mode and the conversation is busy), 3 steered into the active turn (never for a
-- paused agent: its message queues, as pause lets no new input reach it), 4 full (max_queued
-- messages already wait), or {"", 5, retry_after_ms}: the sender is over its rate. Nothing is
-- written when the message is refused, so a refusal costs the sender no rate.
-- In interrupt mode a new message (never a duplicate, never a refused one: those return
-- above) first does what stop.lua does, and the answer is {run_id, 1, 0, stopped turn id or
-- "", cleared message JSON...}: the cap does not apply, as the queue is cleared for it.
--
-- The rate is GCRA: KEYS[7] holds the sender's "theoretical arrival time" (ms). Each accepted
-- message moves it period/count later (from now, when it lies in the past); a message is
-- refused while it lies more than one period ahead. So `count` messages pass in a burst, then
-- one per period/count.
if ARGV[6] == "1" then
  local first = redis.call("GET", KEYS[1])
  if first then
    -- A write (the mark's own TTL, set again) so that a WAIT after this call covers the
    -- replication of the first accept: Redis 7 counts only the waiting connection's writes.
    local ttl = redis.call("PTTL", KEYS[1])
    if ttl > 0 then
      redis.call("PEXPIRE", KEYS[1], ttl)
    end
    return {first, 0}
  end
end
local mode = ARGV[7]
local now = tonumber(ARGV[9])
local busy = redis.call("EXISTS", KEYS[4]) == 1
if mode == "reject" and (busy or redis.call("LLEN", KEYS[2]) > 0) then
  return {"", 2}
end
local max_queued = tonumber(ARGV[10])
if mode ~= "interrupt" and max_queued > 0 and redis.call("LLEN", KEYS[2]) + redis.call("LLEN", KEYS[5]) >= max_queued then
  return {"", 4}
end
local rate_count = tonumber(ARGV[11])
local period = tonumber(ARGV[12])
local tat = nil
if rate_count > 0 then
  tat = math.max(tonumber(redis.call("GET", KEYS[7]) or "0"), now) + period / rate_count
  if tat - now > period then
    return {"", 5, math.ceil(tat - now - period)}
  end
end
if ARGV[6] == "1" then
  redis.call("SET", KEYS[1], ARGV[1], "EX", tonumber(ARGV[4]))
end
redis.call("SET", KEYS[3], ARGV[3], "EX", tonumber(ARGV[5]))
redis.call("ZADD", KEYS[10], now, ARGV[8])
redis.call("HSET", KEYS[11], ARGV[8], ARGV[13])
redis.call("ZADD", KEYS[12], now, ARGV[1])
redis.call("ZREMRANGEBYRANK", KEYS[12], 0, -51)
if tat then
  redis.call("SET", KEYS[7], math.ceil(tat), "PX", math.ceil(tat - now) + 1000)
end
if mode == "steer" and busy and not redis.call("HGET", KEYS[4], "cancelled")
   and redis.call("HEXISTS", KEYS[8], ARGV[13]) == 0 then
  redis.call("RPUSH", KEYS[5], ARGV[2])
  return {ARGV[1], 3}
end
local out = {ARGV[1], 1}
if mode == "interrupt" then
  -- As stop.lua: a turn already delivering its reply cannot be taken back.
  local turn = redis.call("HGET", KEYS[4], "turn_id") or ""
  if turn ~= "" and not redis.call("HGET", KEYS[4], "cancelled")
     and not redis.call("HGET", KEYS[4], "delivering") then
    redis.call("HSET", KEYS[4], "cancelled", "interrupt")
  else
    turn = ""
  end
  out = {ARGV[1], 1, 0, turn}
  for _, key in ipairs({KEYS[5], KEYS[2]}) do
    for _, m in ipairs(redis.call("LRANGE", key, 0, -1)) do out[#out + 1] = m end
  end
  redis.call("DEL", KEYS[2], KEYS[5])
  redis.call("ZREM", KEYS[6], ARGV[8])
  redis.call("HDEL", KEYS[9], ARGV[8])
end
redis.call("RPUSH", KEYS[2], ARGV[2])
redis.call("ZADD", KEYS[6], "NX", tonumber(ARGV[9]), ARGV[8])
return out
