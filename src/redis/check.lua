-- tower-sliding-window: one sliding-window decision, atomically, on Redis' clock.
-- The same ring semantics as src/ring/mod.rs, with whole slot numbers instead of tags
-- (Lua numbers are doubles: integers are exact below 2^53, and microseconds
-- since 1970 stay below that until the year 2255).
--
-- KEYS[1]  the key: a string packed with struct.pack, written whole by each
--          call that changes it and expiring (PX) once its newest units have
--          left the window. A header '<BdI4ddd': format 3, the bucket width w
--          (µs) and count N its slots are numbered in, the newest slot entered,
--          the slot at which it was last converted from another width (-1:
--          never), and the key's incarnation (the microsecond it was created:
--          a key lost and created again is another incarnation); then one
--          record '<dI4H' per slot holding units inside the span (slot, units,
--          the offset of the newest admission inside the slot, in 1/65 536 of
--          w: src/rule.rs), newest first. Formats 1 (without the incarnation)
--          and 2 (records without offsets) are read, their records as admitted
--          at their slots' ends, and written back as format 3. One GET and one
--          SET: a hash of a field per slot costs a command more and a string
--          per field.
--          A record may lie ahead of the newest slot: a conversion to a
--          narrower width puts an old slot's units at the new slot holding the
--          old one's last instant, which may not have come yet.
-- ARGV[1]  limit L
-- ARGV[2]  N, buckets per window
-- ARGV[3]  bucket width w in microseconds
-- ARGV[4]  cost (0..=L; the client answers larger costs itself)
-- ARGV[5]  "1" for interpolated precision, "0" for strict
-- ARGV[6]  optional: the time in microseconds (tests), or "" for Redis' TIME
-- ARGV[7]  optional, a lease: the units a second this instance expects of the
--          key (0: no lease)
-- ARGV[8]  the units this instance holds unused of the key, in all its grants
-- ARGV[9]  D: what one instance holds unused of a key, its grants together,
--          stays at most 1/D of what the window has left (its own unused
--          units counted as left)
-- ARGV[10] units handed back (a lease's leftovers, an undone decision) ...
-- ARGV[11] ... at this slot ...
-- ARGV[12] ... of this incarnation of the key: lowered before the check, only
--          while the slot is inside the span, the key the incarnation that
--          counted them, in this geometry and not converted at or after the
--          slot (else their units may have moved, or were never counted here:
--          nothing is given back).
-- ARGV[13] optional: "1" for a charge, whose cost is counted whether it fits
--          or not (an excess known only after the response; any cost).
--
-- Returns {allowed (0/1), remaining, retry_after_ns, reset_ns, slot, granted,
-- valid_us, incarnation, handed_back}: `granted` units counted at `slot` (the
-- cost and a lease's extra units, 0 when denied), usable for `valid_us`, until
-- the slot ends, in this `incarnation` of the key; `handed_back` of the units
-- handed back were lowered (0: refused). Waits are in nanoseconds: a bucket's
-- units leave the window at its newest admission's instant, to 1/65 536 of
-- the bucket, plus the window, as the in-memory ring counts them.
--
-- Strict mode counts the oldest bucket of the span (age N) only until its
-- newest admission has left the window; interpolated mode weighs it by its
-- slot and records offsets at slots' ends.
--
-- Every decision runs this, so its common path (a check of a key whose newest
-- record is the current slot, or a new slot) unpacks the header and the
-- records once and writes the key with one pack: no closures, no tables.

local key = KEYS[1]
local limit = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local w = tonumber(ARGV[3])
local cost = tonumber(ARGV[4])
local interpolated = ARGV[5] == '1'
local more = #ARGV > 5

local now = more and tonumber(ARGV[6])
if not now then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local HDR = 38 -- where the first record starts (the header is 37 bytes)
local REC = 14
local STEPS = 65536
local MAX_OFFSET = STEPS - 1

-- The latest nanosecond into a slot that offset `o` stands for:
-- ceil((o + 1) * w_ns / 2^16) - 1, split so that every product stays exact
-- in a double.
local wns = w * 1000
local wq = math.floor(wns / STEPS)
local wr = wns - wq * STEPS
-- Nanoseconds from `t` (µs) until the units of slot `x`, the newest at `o`,
-- have all left the window (negative once they have), written out where
-- used (a closure per call costs more than the arithmetic):
--   ((x + n) * w - t) * 1000 + (o + 1) * wq + ceil((o + 1) * wr / STEPS) - 1

-- s = floor(now / w), corrected for the double division's rounding.
local s = math.floor(now / w)
if s * w > now then s = s - 1 elseif (s + 1) * w <= now then s = s + 1 end

-- A key of another type fails here with Redis' WRONGTYPE: never overwritten.
local v = redis.call('GET', key)
local newest, conv, born = -1, -1, now
local dirty = false -- the key changes even if nothing is counted
local same = true -- the key is numbered in this geometry (units may be handed back)
local min_ttl = 0 -- a converted key lives at least as long as it would have

if v then
  local version = string.byte(v, 1)
  if version == 1 then
    -- Written by an older version: incarnation 0 (a key created here never
    -- has it), then read as format 2.
    local kw, kn, nw, cv = struct.unpack('<dI4dd', v, 2)
    v = struct.pack('<BdI4ddd', 2, kw, kn, nw, cv, 0) .. string.sub(v, 30)
    version = 2
  end
  if version == 2 then
    -- Records without offsets: their units as admitted at their slots' ends.
    local parts = {string.char(3) .. string.sub(v, 2, HDR - 1)}
    for pos = HDR, #v - 1, 12 do
      local slot, c = struct.unpack('<dI4', v, pos)
      parts[#parts + 1] = struct.pack('<dI4H', slot, c, MAX_OFFSET)
    end
    v = table.concat(parts)
    dirty = true
  elseif version ~= 3 then
    return redis.error_reply('tower-sliding-window: ' .. key .. ' is of an unknown format')
  end
  local kw, kn
  version, kw, kn, newest, conv, born = struct.unpack('<BdI4ddd', v)
  if (kw ~= w or kn ~= n) and cost == 0 and more and ARGV[10]
      and tonumber(ARGV[7]) == 0 and tonumber(ARGV[10]) > 0 then
    -- A hand-back or an undo from a store of another geometry: its units
    -- may have moved, so nothing is given back, and the key is left as it
    -- is (converting it would only move counts, and drop those out of that
    -- store's window).
    return {1, 0, 0, 0, s, 0, 0, born, 0}
  end
  if kw ~= w then
    -- Slots of another width (the store was reconfigured to another window or
    -- bucket count; the key keeps its name so that its counts carry over). The
    -- script does not know the old window, so it moves counts conservatively:
    -- each old slot's units go to the slot holding that slot's last instant
    -- (never earlier than when they were counted, nor than a grant of that
    -- slot may still admit them, so possibly a slot still to come); those
    -- already out of this window are dropped. The clock reached at least
    -- the start of the old newest slot: that is the newest slot here, unless it
    -- is more than a window ahead (a clock that far behind is not held for).
    min_ttl = redis.call('PTTL', key)
    local a = newest * kw
    local held = math.floor(a / w)
    if held * w > a then held = held - 1 elseif (held + 1) * w <= a then held = held + 1 end
    if held > s and held <= s + n then s = held end
    local moved, slots = {}, {}
    for pos = HDR, #v - 1, REC do
      local o, c = struct.unpack('<dI4H', v, pos)
      a = (o + 1) * kw - 1
      local p = math.floor(a / w)
      if p * w > a then p = p - 1 elseif (p + 1) * w <= a then p = p + 1 end
      if s - p <= n then
        if not moved[p] then slots[#slots + 1] = p end
        moved[p] = (moved[p] or 0) + c
      end
    end
    table.sort(slots, function(x, y) return x > y end)
    local out = {struct.pack('<BdI4ddd', 3, w, n, s, s, born)}
    for i = 1, #slots do
      -- As admitted at the end of the slot holding the old slot's end.
      out[i + 1] = struct.pack('<dI4H', slots[i], moved[slots[i]], MAX_OFFSET)
    end
    v = table.concat(out)
    newest, conv, dirty, same = s, s, true, false
  elseif kn ~= n then
    -- Another bucket count at the same width (a window changed by whole
    -- buckets): the slots stand, and the key must now live as long as this
    -- window needs after its newest units, or as the old one did.
    min_ttl = redis.call('PTTL', key)
    dirty, same = true, false
  end
  -- A newest slot more than a window ahead is not a lagging clock worth
  -- holding for: start the key afresh.
  if newest > s + n then
    v, newest, conv, born, dirty = nil, -1, -1, now, true
  end
end

-- A clock that steps back (a failover to a host whose clock lags) is held at the
-- key's newest slot, as the in-memory ring does: nothing counted expires early.
if newest > s then s = newest end

local back, back_slot = 0, -1
if more and ARGV[12] and same and tonumber(ARGV[12]) == born then
  back, back_slot = tonumber(ARGV[10]), tonumber(ARGV[11])
end

-- The instant this check runs at: its clock, or the start of the newest slot
-- when the clock is behind it (its units count as admitted then, as the
-- ring's do).
local at = now
if at < s * w then at = s * w end

-- The records inside the span [s - N, s] (and any ahead of it) are those
-- before `cut` (newest first, so the stale ones are a tail, dropped by not
-- copying it).
local used, oldest, oldest_off, cut = 0, 0, MAX_OFFSET, HDR
local first_slot, first_count, first_off = -1, 0, 0 -- the newest record
local back_pos = nil -- the record units are handed back to
if v then
  for pos = HDR, #v - 1, REC do
    local slot, c, o = struct.unpack('<dI4H', v, pos)
    local a = s - slot
    if a > n then break end
    if pos == HDR then first_slot, first_count, first_off = slot, c, o end
    if slot == back_slot and back > 0 and slot > conv then
      if back > c then back = c end
      c = c - back
      back_pos = pos
    end
    if a == n then oldest, oldest_off = c, o end
    used = used + c
    cut = pos + REC
  end
  if cut <= #v then dirty = true end
end
if not back_pos then back = 0 end

-- Strict: the oldest bucket no longer counts once its newest admission has
-- left the window.
local gone = 0
if not interpolated and oldest > 0
    and (s * w - at) * 1000 + (oldest_off + 1) * wq + math.ceil((oldest_off + 1) * wr / STEPS) - 1 <= 0 then
  gone = oldest
end

-- Interpolated: the window [now - W, now] still covers (w - elapsed) of the oldest
-- bucket, whose units are weighted by that share; the remaining units are then
-- floor((limit * w - (total * w - oldest * elapsed)) / w), formed without
-- total * w (total may exceed the limit, up to about twice; the builder only
-- keeps (limit + 1) * w below 2^53).
local elapsed, bonus = 0, 0
local fits
if interpolated then
  elapsed = now - s * w
  if elapsed < 0 then elapsed = 0 elseif elapsed > w then elapsed = w end
  bonus = math.floor(oldest * elapsed / w)
  -- (used + cost) * w - oldest * elapsed <= limit * w, with every product below
  -- limit * w (exact): past the limit by more than the oldest bucket never fits.
  local over = used + cost - limit
  fits = over <= 0 or (over <= oldest and over * w <= oldest * elapsed)
else
  fits = used - gone + cost <= limit
end

-- A charge counts its cost past the limit if need be: the key's checks are
-- then denied until the window is back under it.
local charge = more and ARGV[13] == '1'
if charge then fits = true end

local valid = (s + 1) * w - now
if valid > w then valid = w end

local granted = 0
if fits then
  granted = cost
  if more and ARGV[7] then
    local rate = tonumber(ARGV[7])
    if rate > 0 then
      -- A lease: what this instance expects to use until the slot ends, beyond
      -- what it holds, at most 1/D of what the window has left after the cost.
      local have = tonumber(ARGV[8])
      local extra = math.floor(rate * valid / 1000000) - have
      local cap = math.floor((limit - used - cost + bonus + have) / tonumber(ARGV[9])) - have
      if extra > cap then extra = cap end
      if extra > 0 then granted = cost + extra end
    end
  end
end

-- The newest offset of the current slot's units after this check: its own
-- admission's (the offset of `at` in slot s, rounded down: src/rule.rs), or
-- the slot's end for a lease (its units may be used until then) and in
-- interpolated mode.
local my_off = MAX_OFFSET
if not interpolated and granted <= cost then
  local into = (at - s * w) * STEPS
  my_off = math.floor(into / w)
  if my_off * w > into then my_off = my_off - 1 elseif (my_off + 1) * w <= into then my_off = my_off + 1 end
  if my_off > MAX_OFFSET then my_off = MAX_OFFSET end
end
local cur_off = my_off
if first_slot == s and first_off > cur_off then cur_off = first_off end

-- Write the key when something changed: units counted or handed back, stale
-- records dropped, a conversion, or a newer slot entered by a check that
-- counted nothing (a denial: the ring publishes its newest slot too).
local youngest, youngest_off = first_slot, first_off -- the newest record
if granted > 0 or back > 0 or dirty or (s > newest and used > 0) then
  local value
  if back == 0 and first_slot <= s then
    -- The common path: the current slot's record first, then the others as
    -- they are (the stale tail cut off).
    local from = HDR
    local head
    if granted == 0 then
      head = struct.pack('<BdI4ddd', 3, w, n, s, conv, born)
    elseif first_slot == s then
      head = struct.pack('<BdI4ddddI4H', 3, w, n, s, conv, born, s, first_count + granted, cur_off)
      from = HDR + REC
    else
      head = struct.pack('<BdI4ddddI4H', 3, w, n, s, conv, born, s, granted, cur_off)
    end
    if v and cut > from then value = head .. string.sub(v, from, cut - 1) else value = head end
  else
    -- Units handed back, or records ahead of the current slot: the records
    -- inside the span are rebuilt in order, the handed back ones lowered (or
    -- left out once empty, their offsets kept otherwise), the granted units
    -- added to the current slot.
    local recs, counted = {}, false
    for pos = HDR, cut - 1, REC do
      local slot, c, o = struct.unpack('<dI4H', v, pos)
      if pos == back_pos then c = c - back end
      if slot == s and granted > 0 then
        c = c + granted
        if my_off > o then o = my_off end
        counted = true
      end
      if c > 0 then recs[#recs + 1] = {slot, c, o} end
    end
    if granted > 0 and not counted then recs[#recs + 1] = {s, granted, my_off} end
    table.sort(recs, function(x, y) return x[1] > y[1] end)
    local parts = {struct.pack('<BdI4ddd', 3, w, n, s, conv, born)}
    for i = 1, #recs do parts[i + 1] = struct.pack('<dI4H', recs[i][1], recs[i][2], recs[i][3]) end
    value = table.concat(parts)
  end
  youngest = -1
  if #value >= HDR then
    local ys, _, yo = struct.unpack('<dI4H', value, HDR)
    youngest, youngest_off = ys, yo
  end
  if youngest < 0 then
    redis.call('DEL', key)
  else
    local ttl = math.ceil(((youngest + n + 1) * w - now) / 1000)
    if ttl < min_ttl then ttl = min_ttl end
    if ttl < 1 then ttl = 1 end
    redis.call('SET', key, value, 'PX', ttl)
  end
  used = used + granted
  if n == 0 and granted > 0 then
    -- The current slot is also the oldest.
    oldest = oldest + granted
    if interpolated then bonus = math.floor(oldest * elapsed / w) end
  end
end

-- Time until every counted unit has left: the youngest leaves last (0 once
-- it has, the oldest bucket gone).
local reset = 0
if youngest >= 0 and used > 0 then
  reset = ((youngest + n) * w - now) * 1000 + (youngest_off + 1) * wq
    + math.ceil((youngest_off + 1) * wr / STEPS) - 1
  if reset <= (at - now) * 1000 then reset = 0 end
end

-- What is left: an admission that fits with the oldest bucket counted
-- reports the room counting it (the ring reads that bucket only when it
-- needs its room); a denial, or an admission that needed it, the room
-- without it.
local remaining
if interpolated then
  remaining = limit - used + bonus
elseif granted > 0 and (charge or used - granted + cost <= limit) then
  remaining = limit - used
else
  remaining = limit - used + gone
end
if remaining < 0 then remaining = 0 end

if fits then
  return {1, remaining, 0, reset, s, granted, valid, born, back}
end

-- The exact time until `cost` fits, as the buckets leave oldest first
-- (strict: fits_at in src/rule.rs; interpolated: Ring::denied).
local target = limit - cost
if target < 0 then target = 0 end
local wait
if interpolated then
  local counts = {}
  for pos = HDR, cut - 1, REC do
    local slot, c = struct.unpack('<dI4', v, pos)
    if pos == back_pos then c = c - back end
    counts[s - slot] = c
  end
  -- Units ahead of the current slot (first_slot > s) leave last.
  local last = n
  if first_slot > s then last = first_slot - s + n end
  local t = (s + last + 1) * w
  local u = used
  for k = 0, last do
    local leaving = counts[n - k] or 0
    local after = u - leaving
    if after <= target then
      -- Within slot s + k the leaving bucket's weight falls linearly.
      local excess = u - target
      t = (s + k) * w + math.ceil(excess * w / math.max(leaving, 1))
      break
    end
    u = after
  end
  wait = (t - now) * 1000
else
  -- The records are newest first: walked from the tail, oldest first.
  local u, x, o = used - gone, s, cur_off
  for pos = cut - REC, HDR, -REC do
    local slot, c, off = struct.unpack('<dI4H', v, pos)
    if pos == back_pos then c = c - back end
    if c > 0 and not (slot == s - n and gone > 0) then
      u = u - c
      if u <= target then
        x, o = slot, off
        break
      end
    end
  end
  wait = ((x + n) * w - now) * 1000 + (o + 1) * wq + math.ceil((o + 1) * wr / STEPS) - 1
end
if wait < 1 then wait = 1 end
return {0, remaining, wait, reset, s, 0, valid, born, back}
