-- The peer: GCRA (generic cell rate algorithm), as the usual Redis limiters
-- do it (redis-cell, go-redis/redis_rate): one theoretical arrival time per
-- key, on Redis' clock; a burst of up to `limit`, then `limit` per period.
-- KEYS[1] the key; ARGV[1] limit, ARGV[2] period in microseconds, ARGV[3] cost.
-- Returns {allowed, remaining, retry_after_us, reset_us}.
local limit = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local cost = tonumber(ARGV[3])
local interval = period / limit
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + interval * cost
local allow_at = new_tat - period
if allow_at > now then
  return {0, math.floor((now - (tat - period)) / interval), math.ceil(allow_at - now), math.ceil(tat - now)}
end
redis.call('SET', KEYS[1], string.format('%d', new_tat), 'PX', math.max(1, math.ceil((new_tat - now) / 1000)))
return {1, math.floor((now - allow_at) / interval), 0, math.ceil(new_tat - now)}
