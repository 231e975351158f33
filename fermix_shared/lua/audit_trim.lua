-- Retention: drop the oldest audit entries past a count or an age, and move the chain's anchor
-- to the last one dropped, so the chain still verifies from the anchor.
-- KEYS[1] head: hash {seq, hash, ts, refusals} of the newest entry
-- KEYS[2] entries: hash seq -> entry JSON
-- KEYS[3] anchor: hash {seq, hash, ts, refusals} of the last entry dropped, and how many of
-- the entries dropped so far were refusals (absent: nothing dropped yet)
-- ARGV[1] max_entries: keep at most this many entries that are not refusals (0: no count
-- limit). Refusals of strangers (detail.refusal, counted by audit_append.lua) are not
-- counted: however many strangers write, they cannot push real history out; they go by age,
-- and with the entries older than the oldest one kept.
-- ARGV[2] min_ts_ms: drop entries older than this (ms since epoch; 0: no age limit)
-- ARGV[3] batch: drop at most this many in this call (the caller calls again while it is full)
-- Returns {dropped, anchor seq, status}: status "ok", or "broken" when the oldest entry is
-- missing or unreadable (nothing past it is dropped: verify names it).
local head = tonumber(redis.call("HGET", KEYS[1], "seq") or "0")
local anchor = tonumber(redis.call("HGET", KEYS[3], "seq") or "0")
local max_entries, min_ts, batch = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local refused = tonumber(redis.call("HGET", KEYS[3], "refusals") or "0")
-- Entries kept that count against max_entries: all kept, less the refusals among them.
local counted = head - anchor - (tonumber(redis.call("HGET", KEYS[1], "refusals") or "0") - refused)
local dropped, status = 0, "ok"
local last = nil
local seq = anchor + 1
while seq <= head and dropped < batch do
  local raw = redis.call("HGET", KEYS[2], string.format("%d", seq))
  local ok, entry = pcall(cjson.decode, raw or "")
  if not raw or not ok or type(entry) ~= "table" or type(entry.hash) ~= "string" then
    status = "broken"
    break
  end
  local over = max_entries > 0 and counted > max_entries
  if not over and (min_ts <= 0 or (tonumber(entry.ts) or 0) >= min_ts) then
    break
  end
  redis.call("HDEL", KEYS[2], string.format("%d", seq))
  if type(entry.detail) == "table" and entry.detail.refusal == true then
    refused = refused + 1
  else
    counted = counted - 1
  end
  last = entry
  dropped = dropped + 1
  seq = seq + 1
end
if last then
  redis.call("HSET", KEYS[3], "seq", string.format("%d", seq - 1), "hash", last.hash,
    "ts", string.format("%d", tonumber(last.ts) or 0), "refusals", string.format("%d", refused))
end
return {dropped, seq - 1, status}
