-- The floor of any script that decides on Redis' clock over a key's state:
-- read the time, read the key, write it back with an expiry. It decides
-- nothing; no limiter's script can cost Redis less per decision.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local v = redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], 'x', 'PX', 60000)
return {1, 0, 0, 0}
