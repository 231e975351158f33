-- Resume a paused agent: end its pause and take every conversation the pause held, at once.
-- KEYS[1] paused: agent -> paused at (ms)
-- KEYS[2] held: conversation -> the paused agent its inbox head waits for
-- ARGV[1] agent: the agent to resume
-- Returns {1 if it was paused else 0, conversation...}: the conversations to dispatch again.
-- Each is returned once (its entry is deleted here); a claim that runs after this one finds
-- the agent not paused, and one that ran before wrote its entry, so no conversation is missed.
local out = {redis.call("HDEL", KEYS[1], ARGV[1])}
local held = redis.call("HGETALL", KEYS[2])
for i = 1, #held, 2 do
  if held[i + 1] == ARGV[1] then
    redis.call("HDEL", KEYS[2], held[i])
    out[#out + 1] = held[i]
  end
end
return out
