-- tower-sliding-window: one sliding-window decision, atomically, on Redis' clock.
-- The same ring semantics as src/ring.rs, with whole slot numbers instead of
-- 32-bit tags (Lua numbers are doubles: integers are exact below 2^53, and
-- microseconds since 1970 stay below that until the year 2255).
--
-- KEYS[1]  the key's hash: field "t<w>:<N>" = newest slot entered, named for the
--          geometry its slots are numbered in (bucket width w in µs, N buckets);
--          field "<slot>" = units counted in that slot; field "c" = the slot at
--          which the key was last converted from another width (absent if
--          never). Stale slot fields are deleted here; the key expires (PEXPIRE)
--          when its newest units leave the window. A plain "t" (a key written
--          before the geometry was in the name) is read as this script's.
-- ARGV[1]  limit L
-- ARGV[2]  N, buckets per window
-- ARGV[3]  bucket width w in microseconds
-- ARGV[4]  cost (0..=L; the client answers larger costs itself)
-- ARGV[5]  "1" for interpolated precision, "0" for strict
-- ARGV[6]  optional: the time in microseconds (tests only; otherwise Redis' TIME)
--
-- Returns {allowed (0/1), remaining, retry_after_us, reset_us, slot}.

if redis.replicate_commands then
  redis.replicate_commands()
end

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local w = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interpolated = ARGV[5] == '1'

local now
if ARGV[6] then
  now = tonumber(ARGV[6])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- floor(a / b) for whole a >= 0, b > 0, corrected for the double division's rounding.
local function div(a, b)
  local q = math.floor(a / b)
  if q * b > a then
    q = q - 1
  elseif (q + 1) * b <= a then
    q = q + 1
  end
  return q
end

-- s = floor(now / w), inline: this is every decision's path.
local s = math.floor(now / w)
if s * w > now then
  s = s - 1
elseif (s + 1) * w <= now then
  s = s + 1
end

-- The geometry is in the newest-slot field's name, not a field of its own:
-- HGETALL then returns no more strings than before the geometry was recorded.
local tname = 't' .. ARGV[3] .. ':' .. ARGV[2]
local fields = redis.call('HGETALL', key)
local newest = -1
local tfield = nil -- the newest-slot field's name as found (nil: a new key)
for i = 1, #fields, 2 do
  local f = fields[i]
  -- Written first, so normally the first field. 116 is "t".
  if f == tname or (f ~= 'c' and string.byte(f) == 116) then
    newest = tonumber(fields[i + 1])
    tfield = f
    break
  end
end
local kw = w
if tfield and tfield ~= tname and tfield ~= 't' then
  kw = tonumber(string.match(tfield, '^t(%d+):') or w)
end

-- Slots of another width (the store was reconfigured to another window or
-- bucket count; the key keeps its name so that its counts carry over). The
-- script does not know the old window, so it moves counts conservatively: each
-- old slot's units go to the slot holding that slot's last instant (never
-- earlier than when they were counted), at most the current slot; those already
-- out of this window are dropped. The clock reached at least the start of the
-- old newest slot: that is the newest slot here, unless it is more than a
-- window ahead (a clock that far behind is not held for, as below).
if kw ~= w then
  local old_ttl = redis.call('PTTL', key)
  local held = div(newest * kw, w)
  if held > s and held <= s + n then s = held end
  local moved = {}
  for i = 1, #fields, 2 do
    local o = tonumber(fields[i]) -- a slot field
    if o then
      local p = div((o + 1) * kw - 1, w)
      if p > s then p = s end
      if s - p <= n then
        moved[p] = (moved[p] or 0) + tonumber(fields[i + 1])
      end
    end
  end
  local sf = string.format('%d', s)
  local out = {tname, sf, 'c', sf}
  for p, c in pairs(moved) do
    out[#out + 1] = string.format('%d', p)
    out[#out + 1] = string.format('%d', c)
  end
  redis.call('DEL', key)
  -- In chunks: unpack() of thousands of values would overflow Lua's C stack.
  for i = 1, #out, 500 do
    redis.call('HSET', key, unpack(out, i, math.min(i + 499, #out)))
  end
  -- The longer of the old expiry and this window's from the current slot, so
  -- nothing still counted by either policy expires early.
  local ttl = math.max(1, math.ceil(((s + n + 1) * w - now) / 1000))
  if old_ttl > ttl then ttl = old_ttl end
  redis.call('PEXPIRE', key, ttl)
  fields = out
  newest = s
  tfield = tname
end

-- A clock that steps back (a failover to a host whose clock lags) is held at the
-- key's newest slot, as the in-memory ring does: nothing counted expires early.
-- A newest slot more than a window ahead is not a lagging clock worth holding
-- for: a clock that far behind, or (in a key with a plain "t", written before
-- the geometry was in the name) slots of another bucket width under the same
-- key. Holding would deny the key until the clock got there, for years in the
-- second case: start the key afresh.
if newest > s + n then
  redis.call('DEL', key)
  fields = {}
  newest = -1
  tfield = nil
end

-- Another bucket count at the same width (a window changed by whole buckets),
-- or a plain "t": the slots stand, renamed for this geometry, and the key must
-- now live as long as this window needs after its newest slot, also if every
-- check is denied (a denial sets no expiry).
if tfield and tfield ~= tname then
  local ttl = math.max(1, math.ceil(((newest + n + 1) * w - now) / 1000))
  if redis.call('PTTL', key) < ttl then redis.call('PEXPIRE', key, ttl) end
  redis.call('HDEL', key, tfield)
  redis.call('HSET', key, tname, string.format('%d', newest))
end
if newest > s then s = newest end

-- counts[a] = units recorded at slot s - a, for ages 0..=N (sparse: nil is 0).
local counts = {}
local used = 0
local stale = nil
for i = 1, #fields, 2 do
  local f = fields[i]
  -- Slot fields are the numeric ones ("t…" and "c" are not): no compare per field.
  local o = tonumber(f)
  if o then
    local a = s - o
    if a > n then
      stale = stale or {}
      stale[#stale + 1] = f
    else
      if a < 0 then a = 0 end -- never written ahead of the newest; count it (the safe side)
      local c = tonumber(fields[i + 1])
      counts[a] = (counts[a] or 0) + c
      used = used + c
    end
  end
end
local oldest = counts[n] or 0

-- Interpolated: the window [now - W, now] still covers (w - elapsed) of the oldest
-- bucket, whose units are weighted by that share. Scaled by w to stay in integers.
local elapsed = now - s * w
if elapsed < 0 then elapsed = 0 elseif elapsed > w then elapsed = w end

local function remaining(total)
  local r
  if interpolated then
    -- floor((limit * w - (total * w - oldest * elapsed)) / w) without forming
    -- total * w: total may exceed the limit (up to about twice), and the
    -- builder only keeps (limit + 1) * w below 2^53.
    r = limit - total + math.floor(oldest * elapsed / w)
  else
    r = limit - total
  end
  if r < 0 then return 0 end
  return r
end

-- Time until every counted unit has expired: the youngest leaves last.
local function reset()
  for a = 0, n do
    if (counts[a] or 0) > 0 then
      return (s - a + n + 1) * w - now
    end
  end
  return 0
end

if stale then
  -- In chunks: unpack() of thousands of values would overflow Lua's C stack.
  for i = 1, #stale, 500 do
    redis.call('HDEL', key, unpack(stale, i, math.min(i + 499, #stale)))
  end
end

local fits
if interpolated then
  -- (used + cost) * w - oldest * elapsed <= limit * w, with every product below
  -- limit * w (exact): past the limit by more than the oldest bucket never fits.
  local over = used + cost - limit
  fits = over <= 0 or (over <= oldest and over * w <= oldest * elapsed)
else
  fits = used + cost <= limit
end

local sf = string.format('%d', s)
if fits then
  local current = counts[0] or 0
  counts[0] = current + cost
  used = used + cost
  -- A check enters its slot whether or not it passes (the ring publishes "newest").
  if s > newest then
    redis.call('HSET', key, tname, sf, sf, current + cost)
  else
    redis.call('HSET', key, sf, current + cost)
  end
  if current == 0 then
    -- The first units of slot s: the key is idle once slot s + N + 1 begins.
    -- Later units of the same slot expire at the same moment, so only the first
    -- write of each slot needs to move the expiry.
    redis.call('PEXPIRE', key, math.max(1, math.ceil(((s + n + 1) * w - now) / 1000)))
  end
  return {1, remaining(used), 0, reset(), s}
end

-- Denied (the key holds units, so it exists and has its expiry).
if s > newest and used > 0 then redis.call('HSET', key, tname, sf) end

-- The exact time until `cost` fits, as counts expire slot by slot (Ring::denied).
local target = limit - cost
if target < 0 then target = 0 end
local at = (s + n + 1) * w
local u = used
for k = 0, n do
  local leaving = counts[n - k] or 0
  local after = u - leaving
  if after <= target then
    if interpolated then
      -- Within slot s + k the leaving bucket's weight falls linearly.
      local excess = u - target
      at = (s + k) * w + math.ceil(excess * w / math.max(leaving, 1))
    else
      at = (s + k + 1) * w
    end
    break
  end
  u = after
end
local retry = at - now
if retry < 1 then retry = 1 end
return {0, remaining(used), retry, reset(), s}
