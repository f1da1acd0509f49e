-- tower-sliding-window: give back `cost` units counted at `slot` (an undone decision).
-- KEYS[1] the key's hash, ARGV[1] the slot, ARGV[2] the cost.
-- If the slot's field is gone (expired or the key vanished), there is nothing to give back.
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v then
  local c = tonumber(v) - tonumber(ARGV[2])
  if c > 0 then
    redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', c))
  else
    redis.call('HDEL', KEYS[1], ARGV[1])
  end
end
return 0
