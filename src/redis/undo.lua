-- tower-sliding-window: give back `cost` units counted at `slot` (an undone decision).
-- KEYS[1] the key's hash, ARGV[1] the slot, ARGV[2] the cost, ARGV[3] the bucket
-- width (µs) the slot is numbered in.
-- If the slot's field is gone (expired or the key vanished), there is nothing to give back.
-- If the key has been converted to another width since (the store was
-- reconfigured), or converted at or after that slot, its units may have moved or
-- been dropped: giving back from the slot could take someone else's units, so
-- nothing is given back (the safe side). A key without "w" predates the field.
local v = redis.call('HMGET', KEYS[1], ARGV[1], 'w', 'c')
if not v[1] then return 0 end
if v[2] and v[2] ~= ARGV[3] then return 0 end
if v[3] and tonumber(ARGV[1]) <= tonumber(v[3]) then return 0 end
local c = tonumber(v[1]) - tonumber(ARGV[2])
if c > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', c))
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
