-- Correct charges that redis.lua recorded (ratelimit-proxy): settle a
-- reservation to what it really cost, giving the difference back or
-- charging the extra, and roll back the admissions of a split batch on a
-- Redis Cluster (a refund of the whole cost). See redis.lua for the keys.
--
-- ARGV: [1] number of corrections, [2] now in µs (0: Redis's TIME), [3]
-- maxSlots; then per correction: algorithm ("w": sliding window, "b":
-- token bucket, "c": calendar), what redis.lua recorded (a window
-- admission's time, µs: its slot is the first at or after it; 1 for a
-- bucket; a calendar counter's period start, unix s), when a window
-- admission was counted (µs; 0 for a rollback: not checked; a calendar
-- counter: when its counter was made, µs, 0 for a rollback), the
-- correction (< 0: give back that many units, > 0: charge that many at
-- now), limit, window (µs), burst. KEYS, per correction in order: a
-- sliding window's string and list, a token bucket's key or a calendar
-- counter's key. Returns the number of corrections made.
--
-- A calendar counter is corrected, either way, only while it still counts
-- the period the admission was counted in and that period is the current
-- one: a settlement never lands in the next period.
--
-- A refund is taken from the slot the admission was counted in, never
-- more than it holds, while the admission is in the window and its
-- counter is the one it was counted in (one made after it follows a
-- Reset), and no slot counted at or after it was dropped as expired
-- (gone): as limits/window.go, merging only moves a slot's time later and
-- no two slots share a time, so that slot is the first counted at or
-- after the admission. A slot left empty is dropped. A bucket gets its
-- tokens back at its stored time, never above burst; one that expired has
-- nothing to give back to. An extra charge is counted at now without a
-- decision, as redis.lua would count an admission (and as
-- limits/window.go and limits/bucket.go do): it may take the sum past the
-- limit, the bucket below 0.
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local fmt = string.format
local function int(x) return fmt('%d', x) end
local maxslots = tonumber(ARGV[3])
local max, min, floor = math.max, math.min, math.floor
local sub, pack, unpack_s = string.sub, struct.pack, struct.unpack

-- A window is an array as redis.lua's hits: [1] its string's key, [2]
-- its length (µs), and those below.

-- ---- A sliding window's keys (the same as redis.lua's, checked by a test).
-- window begin
local HEAD, HLEN, SLOT = '<ddddddddd', 72, '<dd'
local FRONT, TAIL, KEEP = 8, 8, 4
-- A window's fields ([1] its string's key, [2] its length, µs): [10]
-- its list's key, [11] its string as read, [12] the slots in it besides
-- the newest; the header's [13] sum, [14] made, [15] gone, [16] front,
-- [17] listed, [18] listUntil, [19] until, [20] and [21] the newest slot
-- (its count 0: none); once expired: [22] how many slots left the
-- window, [23] how many are live, [24] the oldest live slot's time
-- (false: none); the list as read: [25] a chunk (false: none) and [26]
-- where it starts; [27] whether a lost list was forgotten (to be written).

-- The j-th slot of the string besides the newest (1-based): at, n.
local function mslot(v, j) return unpack_s(SLOT, v, 16 * j + 57) end

-- Reads a window's string v (false: none) into w.
local function wopen(w, v)
  if v and #v >= HLEN and (#v - HLEN) % 16 == 0 then
    local m = (#v - HLEN) / 16
    local sum, made, gone, a, ln, le, til, nat, nn = unpack_s(HEAD, v)
    if ln == 0 then a = m end
    -- (Anything else is not this layout: as a fresh window.)
    if a >= 0 and a <= m and ln >= 0 and nn >= 0 and (nn > 0 or m + ln == 0) then
      w[11], w[12], w[13], w[14], w[15], w[16], w[17], w[18], w[19], w[20], w[21] =
        v, m, sum, made, gone, a, ln, le, til, nat, nn
      return
    end
  end
  w[11], w[12], w[13], w[14], w[15], w[16], w[17], w[18], w[19], w[20], w[21] = '', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0
end

-- The list is gone (evicted, or deleted by hand): the window is what
-- the string holds, and no admission counted before its tail is given
-- back (gone: its slot may have been in the list).
local function wrepair(w)
  local v, m, a, sum = w[11], w[12], w[16], w[21]
  for j = 1, m do
    local _, c = mslot(v, j)
    sum = sum + c
  end
  local first = w[20]
  if a < m then first = mslot(v, a + 1) end
  w[15] = max(w[15], first - 1)
  w[16], w[17], w[18], w[13], w[25], w[27] = m, 0, 0, sum, false, true
end

-- The p-th slot of the window, oldest first (1-based): at, n; nil when
-- the list is gone. The list is read FRONT elements at a time.
local function qslot(w, p)
  local a = w[16]
  if p <= a then return unpack_s(SLOT, w[11], 16 * p + 57) end
  local q, ln = p - a, w[17]
  if q <= ln then
    local c = w[25]
    if not c or q <= w[26] or q > w[26] + #c then
      c = redis.call('LRANGE', w[10], int(q - 1), int(q + FRONT - 2))
      w[25], w[26] = c, q - 1
    end
    local s = c[q - w[26]]
    if not s or #s ~= 16 then return nil end
    return unpack_s(SLOT, s)
  end
  local j = p - ln
  if j <= w[12] then return unpack_s(SLOT, w[11], 16 * j + 57) end
  return w[20], w[21]
end

-- Drops (from the sum) the slots that have left the window (now -
-- window, now]: [22] of them, oldest first; [23] live slots are left,
-- the oldest at [24] (false: none).
local function wexpire(w, edge)
  local total, sum = w[12] + w[17], w[13]
  if w[21] > 0 then total = total + 1 end
  local at
  if w[16] > 0 then
    at = unpack_s('<d', w[11], 73)
  elseif w[17] == 0 then
    at = w[20]
  end
  if total == 0 or at and at > edge then -- nothing left: the common case, one read
    w[22], w[23], w[24] = 0, total, total > 0 and at
    return
  end
  local p, c = 1
  while p <= total do
    at, c = qslot(w, p)
    if not at then
      wrepair(w)
      return wexpire(w, edge)
    end
    if at > edge then break end
    sum = sum - c
    p = p + 1
  end
  if sum < 0 then sum = 0 end
  w[13], w[22], w[23] = sum, p - 1, total - p + 1
  if p <= total then w[24] = at else w[24] = false end
end

-- Where an admission at now is counted (limits/window.go's place): the
-- time it is counted at and whether it joins the newest slot.
local function wplace(w, limit)
  if w[23] == 0 then return now, false end
  local newest = w[20]
  local at, tie = now, now <= newest
  if newest > at then at = newest end -- a clock gone backwards keeps the order
  if tie then return at, true end
  if limit > maxslots then
    if w[23] >= maxslots + 1 then return at, true end
    local g = max(floor(w[2] / maxslots), 1)
    return at, floor(newest / g) == floor(at / g)
  end
  return at, w[23] >= max(min(limit, maxslots), 1)
end

-- Writes the window back: its first [22] slots dropped, and, when nat,
-- its newest slot (nat, nn): a new one when add (the newest before it,
-- if live, joins the tail). admit: an admission, whose string lives one
-- window past its newest slot (and a thousandth of it, so that those
-- joining that slot in its thousandth do not move it: they write the
-- header alone); otherwise its expiry is kept. The list is touched only
-- when the front runs out or a tail past TAIL slots moves to it.
local function wsave(w, nat, nn, add, admit)
  local v, m, a, ln, drop, span = w[11], w[12], w[16], w[17], w[22], w[2]
  local dF = min(drop, a)
  local dL = min(drop - dF, ln)
  local dT = min(drop - dF - dL, m - a)
  local live = w[21] > 0 and drop - dF - dL - dT == 0 -- the newest before
  local old = add and live and pack(SLOT, w[20], w[21])
  if not nat then
    nat, nn = 0, 0
    if live then nat, nn = w[20], w[21] end
  end
  local til, ms = w[19]
  if admit and til < nat + span then
    ms = math.ceil((nat + span - now) / 1000) + math.ceil(span / 1e6)
    til = now + ms * 1000
  end
  local na, nl, body
  if drop == 0 and not old then
    if v ~= '' and not ms then
      -- The newest slot or the sum alone: the header alone.
      redis.call('SETRANGE', w[1], '0', pack(HEAD, w[13], w[14], w[15], a, ln, w[18], til, nat, nn))
      return
    end
    na, nl, body = a, ln, sub(v, HLEN + 1)
  elseif dL == 0 and dT == 0 and (ln == 0 or a > dF) then
    -- The list stays as it is: the slots kept are one run of the string.
    local grow = 0
    if old then grow = 1 end
    if ln == 0 then
      na = m - dF + grow
      if na > FRONT + TAIL then na = nil end
    elseif m - a + grow <= TAIL then
      na = a - dF
    end
    if na then
      nl = ln
      body = sub(v, HLEN + 16 * dF + 1) .. (old or '')
    end
  end
  if not body then
    -- The slots of the string, oldest first, the list's place after na.
    local s = {}
    for j = dF + 1, a do s[#s + 1] = sub(v, 16 * j + 57, 16 * j + 72) end
    na = #s
    for j = a + dT + 1, m do s[#s + 1] = sub(v, 16 * j + 57, 16 * j + 72) end
    if old then s[#s + 1] = old end
    nl = ln - dL
    local l = w[10]
    if dL > 0 then
      if nl == 0 then redis.call('DEL', l) else redis.call('LTRIM', l, int(dL), '-1') end
    end
    if nl > 0 and na == 0 then
      -- The front ran out: the list's oldest become the front.
      local c = redis.call('LRANGE', l, '0', int(FRONT - 1))
      if #c == nl then redis.call('DEL', l) else redis.call('LTRIM', l, int(#c), '-1') end
      for j = #s, 1, -1 do s[j + #c] = s[j] end
      for j = 1, #c do s[j] = c[j] end
      na, nl = #c, nl - #c
    end
    if nl == 0 then na = #s end
    -- A tail past TAIL slots keeps its newest KEEP, the others go to the
    -- list (so that a list is written once every few new slots).
    local from, to = na + 1, 0
    if nl == 0 and #s > FRONT + TAIL then
      from, na = FRONT + 1, FRONT
    end
    if #s - na > TAIL then to = #s - KEEP end
    if to >= from then
      if nl == 0 then
        redis.call('DEL', l) -- a list left by a string gone before it
        w[18] = 0
      end
      local moved = {}
      for j = from, to do moved[#moved + 1] = s[j] end
      redis.call('RPUSH', l, unpack(moved))
      nl = nl + #moved
      -- It lives as long as its newest slot is in the window: set to one
      -- window past the string's expiry, so that once a window is enough.
      -- (A list left behind by a string gone before it is deleted above
      -- when a list starts again.)
      if w[18] < unpack_s('<d', moved[#moved]) + span then
        local lms = math.ceil((til + span - now) / 1000)
        redis.call('PEXPIRE', l, int(lms))
        w[18] = now + lms * 1000
      end
      local t = {}
      for j = 1, from - 1 do t[#t + 1] = s[j] end
      for j = to + 1, #s do t[#t + 1] = s[j] end
      s = t
    end
    if nl == 0 then
      na, w[18] = #s, 0
    end
    body = table.concat(s)
  end
  local value = pack(HEAD, w[13], w[14], w[15], na, nl, w[18], til, nat, nn) .. body
  if ms then
    redis.call('SET', w[1], value, 'PX', int(ms))
  else
    redis.call('SET', w[1], value, 'KEEPTTL')
  end
end
-- window end

-- Give back units of the admission counted at rec (µs) in window w, at
-- is rec, or 0 for a rollback (not checked: just after the decision).
local function wrefund(w, rec, at, units)
  if w[21] == 0 then return 0 end -- no slot
  if at > 0 then
    if w[14] > at then return 0 end -- another counter
    -- Slots counted then were dropped (at a clock read later than now):
    -- as limits/window.go, which cannot tell its slots apart, does not
    -- give back.
    if w[15] >= at then return 0 end
  end
  -- The first slot counted at or after rec, looked for from the newest:
  -- the newest (j = 0), j in the string, or q in the list.
  local v, m, a, ln = w[11], w[12], w[16], w[17]
  if w[20] < rec then return 0 end
  local j, q, lv = 0
  local lo = a + 1
  if ln == 0 then lo = 1 end
  for i = m, lo, -1 do
    if mslot(v, i) < rec then break end
    j = i
  end
  if (j == lo or lo > m) and ln > 0 then
    -- The whole tail is later: the list, from its newest, then the front.
    local upto, done = ln, false
    while upto > 0 and not done do
      local from = max(upto - FRONT + 1, 1)
      local c = redis.call('LRANGE', w[10], int(from - 1), int(upto - 1))
      if #c ~= upto - from + 1 then
        -- The list is gone: what is left, written back, decides.
        wrepair(w)
        if wrefund(w, rec, at, units) == 1 then return 1 end
        redis.call('SET', w[1], pack(HEAD, w[13], w[14], w[15], w[16], w[17], w[18], w[19], w[20], w[21]) ..
          sub(w[11], HLEN + 1), 'KEEPTTL')
        return 0
      end
      for i = #c, 1, -1 do
        if #c[i] ~= 16 or unpack_s('<d', c[i]) < rec then
          done = true
          break
        end
        j, q, lv = nil, from + i - 1, c[i]
      end
      upto = from - 1
    end
    if not done then
      for i = a, 1, -1 do
        if mslot(v, i) < rec then break end
        j, q = i, nil
      end
    end
  end
  local t, held
  if q then
    t, held = unpack_s(SLOT, lv)
  elseif j > 0 then
    t, held = mslot(v, j)
  else
    t, held = w[20], w[21]
  end
  if units > held then units = held end
  local le, nat, nn, body = w[18], w[20], w[21]
  if q then
    if units == held then
      redis.call('LREM', w[10], '1', lv)
      ln = ln - 1
    else
      redis.call('LSET', w[10], int(q - 1), pack(SLOT, t, held - units))
    end
  elseif j > 0 then
    local at0 = 16 * j + 57
    if units == held then
      body = sub(v, HLEN + 1, at0 - 1) .. sub(v, at0 + 16)
      m = m - 1
      if j <= a then a = a - 1 end
    else
      body = sub(v, HLEN + 1, at0 - 1) .. pack(SLOT, t, held - units) .. sub(v, at0 + 16)
    end
  elseif units < held then
    nn = held - units
  else
    -- The newest slot is emptied: the one before it is the newest, from
    -- the tail, the list or the front.
    nat, nn = 0, 0
    if m > a or (ln == 0 and m > 0) then
      nat, nn = mslot(v, m)
      body = sub(v, HLEN + 1, HLEN + 16 * (m - 1))
      m = m - 1
      if a > m then a = m end
    elseif ln > 0 then
      local s = redis.call('RPOP', w[10])
      ln = ln - 1
      if s and #s == 16 then
        nat, nn = unpack_s(SLOT, s)
      else
        ln = 0
      end
    end
  end
  if ln == 0 then a, le = m, 0 end
  local head = pack(HEAD, max(w[13] - units, 0), w[14], w[15], a, ln, le, w[19], nat, nn)
  if body then
    redis.call('SET', w[1], head .. body, 'KEEPTTL')
  else
    redis.call('SETRANGE', w[1], '0', head)
  end
  return 1
end

local function refundWindow(w, rec, at, units)
  if at > 0 and at + w[2] <= now then return 0 end -- left the window
  wopen(w, redis.call('GET', w[1]))
  return wrefund(w, rec, at, units)
end

-- Count units at now in window w, as redis.lua counts an admission
-- (evalWindow and takeWindow in mode 0): first forget the slots that have
-- left the window, then count in the newest slot or a new one as
-- limits/window.go's place says.
local function chargeWindow(w, units, limit)
  wopen(w, redis.call('GET', w[1]))
  local edge = now - w[2]
  wexpire(w, edge)
  if w[22] > 0 then w[15] = max(w[15], edge) end
  local at, merge = wplace(w, limit)
  w[13] = w[13] + units
  if w[14] == 0 then w[14] = at end
  if merge then
    wsave(w, at, w[21] + units, false, true)
  else
    wsave(w, at, units, true, true)
  end
end

-- bucket begin
-- A token bucket's state: its tokens (fractional; below 0 after a
-- settled charge, a debt) at its time (µs), struct "<dd" after a 0 byte;
-- the "tokens last" text of earlier releases is read too. Read: tokens
-- and time, nil for none (or unreadable: a fresh bucket).
local function bread(s)
  if not s then return nil end
  if #s == 17 and string.byte(s, 1) == 0 then
    local t, l = unpack_s('<dd', s, 2)
    return t, l
  end
  local t, l = string.match(s, '^(%S+) (%S+)$')
  t, l = tonumber(t), tonumber(l)
  if t and l then return t, l end
  return nil
end

local function bvalue(tokens, last) return pack('<Bdd', 0, tokens, last) end
-- bucket end

local function refundBucket(b, units, burst)
  local tokens, last = bread(redis.call('GET', b))
  if not tokens then return 0 end
  tokens = tokens + units
  if tokens > burst then tokens = burst end
  -- The bucket keeps its time and its expiry (it is full sooner: the
  -- expiry covers it).
  redis.call('SET', b, bvalue(tokens, last), 'KEEPTTL')
  return 1
end

-- redis.lua's fill, the same operations in the same order.
local function fill(tokens, elapsed, limit, window, burst)
  local add = elapsed * limit / window
  local room = burst
  if tokens < 0 then room = burst - tokens end
  if add > room then return burst end
  local t = tokens + add
  if t > burst then t = burst end
  return t
end

-- Take units at now as redis.lua's takeBucket takes an admission's cost
-- (limits/bucket.go's charge): fill, subtract, keep until full again.
local function chargeBucket(b, units, limit, window, burst)
  local tokens, last = bread(redis.call('GET', b))
  if not tokens then tokens, last = burst, now end -- a fresh bucket is full
  if tokens > burst then tokens = burst end
  local e = now - last
  if e < 0 then e = 0 end
  tokens = fill(tokens, e, limit, window, burst) - units
  if now > last then last = now end
  local full = 1e15
  if limit > 0 then full = math.min((burst - tokens) * window / limit, 1e15) end
  redis.call('SET', b, bvalue(tokens, last), 'PX', int(math.ceil(full / 1000) + 1000))
end

local function settleCalendar(c, start, made, delta)
  local s = redis.call('GET', c)
  if not s then return 0 end
  local st, count, m = string.match(s, '^(%S+) (%S+) (%S+)$')
  if tonumber(st) ~= start or tonumber(count) == nil then return 0 end
  if made ~= 0 and tonumber(m) ~= made then return 0 end -- made again since (a Reset)
  count = tonumber(count) + delta
  if count < 0 then count = 0 end
  redis.call('SET', c, string.format('%d %d %s', start, count, m), 'KEEPTTL')
  return 1
end

local done = 0
local k = 1
for i = 1, n do
  local a = 3 + (i - 1) * 7
  local alg, rec, at, delta = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local limit, window, burst = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
  if alg == 'c' then
    local c = KEYS[k]
    k = k + 1
    if delta ~= 0 then done = done + settleCalendar(c, rec, at, delta) end
  elseif alg == 'b' then
    local b = KEYS[k]
    k = k + 1
    if delta < 0 then
      done = done + refundBucket(b, -delta, burst)
    elseif delta > 0 then
      chargeBucket(b, delta, limit, window, burst)
      done = done + 1
    end
  else
    -- [1], [2], ([3] to [9] unused), then [10] to [27] (see the window code)
    local w = {KEYS[k], window, false, false, false, false, false, false, false,
               KEYS[k + 1], '', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, false, 0, false}
    k = k + 2
    if delta < 0 then
      done = done + refundWindow(w, rec, at, -delta)
    elseif delta > 0 then
      chargeWindow(w, delta, limit)
      done = done + 1
    end
  end
end
return done
