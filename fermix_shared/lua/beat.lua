-- A worker process's heartbeat. The beat is Redis server time, so that whoever judges it
-- (the reaper, in Lua) compares it with the same clock whatever the hosts' clocks say.
-- KEYS[1] beats: worker process -> last heartbeat (ms, Redis server time)
-- KEYS[2] workers: Celery node name -> last seen (unix seconds, what status lists)
-- ARGV[1] worker: the process's name (node name and pid, as turns record it)
-- ARGV[2] node: its Celery node name
-- ARGV[3] seen: now, unix seconds
-- Returns the beat written (ms).
redis.replicate_commands()
local t = redis.call("TIME")
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call("HSET", KEYS[1], ARGV[1], now)
redis.call("HSET", KEYS[2], ARGV[2], ARGV[3])
return now
