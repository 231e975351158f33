-- Append one entry to the fleet's audit chain: seq, time and hash assigned in one step, so
-- appends from any number of workers and hosts form one chain (no retries, no lost updates).
-- KEYS[1] head: hash {seq, hash, ts, refusals} of the newest entry (absent: empty chain)
-- KEYS[2] entries: hash seq -> entry JSON
-- ARGV[1] body: the entry's body as canonical JSON (an object; no seq, ts, prev, hash)
-- ARGV[2] digest: sha256 hex of ARGV[1], computed by the caller (verify recomputes it)
-- ARGV[3] refusal: "1" for an aggregated refusal of a stranger (detail.refusal = true): the
-- head counts them ("refusals"), so retention by count leaves them out (audit_trim.lua)
-- The entry's hash is sha256(prev .. "\n" .. seq .. "\n" .. ts .. "\n" .. digest), prev being
-- the newest entry's hash (64 zeros for the first). Only that short link (about 150 bytes,
-- three sha256 blocks) is hashed here, whatever the body's size.
-- Returns {seq, ts, hash}.
local band, bor, bxor = bit.band, bit.bor, bit.bxor
local rshift, lshift, ror, tobit, tohex = bit.rshift, bit.lshift, bit.ror, bit.tobit, bit.tohex
local byte, char, rep, floor = string.byte, string.char, string.rep, math.floor
local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}

-- FIPS 180-4 SHA-256 of a byte string, as 64 lowercase hex digits. Redis Lua numbers are
-- doubles: sums of a few 32-bit words stay exact, and `bit` reduces them mod 2^32.
local function sha256(msg)
  local bits = #msg * 8
  local pad = (55 - #msg) % 64
  local hi, lo = floor(bits / 4294967296), bits % 4294967296
  msg = msg .. "\128" .. rep("\0", pad) .. char(
    band(rshift(hi, 24), 255), band(rshift(hi, 16), 255), band(rshift(hi, 8), 255), band(hi, 255),
    band(rshift(lo, 24), 255), band(rshift(lo, 16), 255), band(rshift(lo, 8), 255), band(lo, 255))
  local h0, h1, h2, h3 = 0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a
  local h4, h5, h6, h7 = 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19
  local w = {}
  for at = 1, #msg, 64 do
    for i = 1, 16 do
      local p = at + (i - 1) * 4
      local b1, b2, b3, b4 = byte(msg, p, p + 3)
      w[i] = bor(lshift(b1, 24), lshift(b2, 16), lshift(b3, 8), b4)
    end
    for i = 17, 64 do
      local x, y = w[i - 15], w[i - 2]
      w[i] = tobit(w[i - 16] + bxor(ror(x, 7), ror(x, 18), rshift(x, 3)) + w[i - 7]
        + bxor(ror(y, 17), ror(y, 19), rshift(y, 10)))
    end
    local a, b, c, d, e, f, g, h = h0, h1, h2, h3, h4, h5, h6, h7
    for i = 1, 64 do
      local t1 = h + bxor(ror(e, 6), ror(e, 11), ror(e, 25)) + bxor(g, band(e, bxor(f, g)))
        + K[i] + w[i]
      local t2 = bxor(ror(a, 2), ror(a, 13), ror(a, 22)) + bor(band(a, b), band(c, bor(a, b)))
      h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
    end
    h0, h1, h2, h3 = tobit(h0 + a), tobit(h1 + b), tobit(h2 + c), tobit(h3 + d)
    h4, h5, h6, h7 = tobit(h4 + e), tobit(h5 + f), tobit(h6 + g), tobit(h7 + h)
  end
  return tohex(h0) .. tohex(h1) .. tohex(h2) .. tohex(h3) .. tohex(h4) .. tohex(h5)
    .. tohex(h6) .. tohex(h7)
end

local head = redis.call("HMGET", KEYS[1], "seq", "hash")
local seq = string.format("%d", tonumber(head[1] or "0") + 1)
local prev = head[2] or string.rep("0", 64)
local now = redis.call("TIME")
local ts = string.format("%d", tonumber(now[1]) * 1000 + floor(tonumber(now[2]) / 1000))
local hash = sha256(prev .. "\n" .. seq .. "\n" .. ts .. "\n" .. ARGV[2])
local fields = string.sub(ARGV[1], 2)
if fields ~= "}" then
  fields = "," .. fields
end
redis.call("HSET", KEYS[2], seq, '{"hash":"' .. hash .. '","prev":"' .. prev .. '","seq":' .. seq
  .. ',"ts":' .. ts .. fields)
redis.call("HSET", KEYS[1], "seq", seq, "hash", hash, "ts", ts)
if ARGV[3] == "1" then
  redis.call("HINCRBY", KEYS[1], "refusals", 1)
end
return {tonumber(seq), tonumber(ts), hash}
