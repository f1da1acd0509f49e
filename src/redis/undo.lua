-- tower-sliding-window: give back `cost` units counted at `slot` (an undone decision).
-- KEYS[1] the key's hash, ARGV[1] the slot, ARGV[2] the cost, ARGV[3] the bucket
-- width (µs) and ARGV[4] the bucket count the slot was counted under.
-- If the slot's field is gone (expired or the key vanished), there is nothing to give back.
-- If the key's newest-slot field no longer names that geometry (the store was
-- reconfigured and the key converted since), or the key was converted at or
-- after that slot, its units may have moved or been dropped: giving back from
-- the slot could take someone else's units, so nothing is given back (the safe
-- side). A plain "t" predates geometry in the name: read as this one.
local v = redis.call('HMGET', KEYS[1], ARGV[1], 't' .. ARGV[3] .. ':' .. ARGV[4], 't', 'c')
if not v[1] then return 0 end
if not v[2] and not v[3] then return 0 end
if v[4] and tonumber(ARGV[1]) <= tonumber(v[4]) then return 0 end
local c = tonumber(v[1]) - tonumber(ARGV[2])
if c > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], string.format('%d', c))
else
  redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
