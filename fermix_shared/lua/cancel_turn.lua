-- Kill: cancel one conversation's active turn cooperatively (its worker winds down and its
-- subagents stop, as on /stop), leaving the queue as it is: the messages behind it are refused
-- one by one, each with its reply, when they are claimed.
-- KEYS[1] active: the active-turn hash
-- ARGV[1] turn_id: the turn to cancel (the one the caller read; a turn started since is not it)
-- ARGV[2] reason: what the worker is told ("killed")
-- Returns 1 when the turn was cancelled, else 0 (another turn, already cancelled, or already
-- delivering its reply: a reply being sent cannot be taken back, it finishes).
if redis.call("HGET", KEYS[1], "turn_id") ~= ARGV[1]
   or redis.call("HGET", KEYS[1], "cancelled")
   or redis.call("HGET", KEYS[1], "delivering") then
  return 0
end
redis.call("HSET", KEYS[1], "cancelled", ARGV[2])
return 1
