-- Reserve the next send slot across several limits at once (e.g. per chat and global).
-- KEYS[1..] limits: each limit's "next free at" key
-- ARGV[1] now_ms: now, in ms
-- ARGV[2..] intervals_ms: each limit's interval, in the order of KEYS
-- A key may also hold a platform-imposed pause (429 retry_after) set by `block`.
-- Returns the ms to wait before sending (0 = send now); the slot is reserved either way.
local now = tonumber(ARGV[1])
local start = now
for i = 1, #KEYS do
  local free_at = tonumber(redis.call("GET", KEYS[i]) or "0")
  if free_at > start then start = free_at end
end
for i = 1, #KEYS do
  local interval = tonumber(ARGV[1 + i])
  redis.call("SET", KEYS[i], start + interval, "PX", interval + (start - now) + 1000)
end
return start - now
