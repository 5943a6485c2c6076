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

-- ---- A sliding window's keys (the same as redis.lua's, checked by a test).
-- window begin
local HEAD, HLEN, SLOT = '<dddddd', 48, '<dd'
local FRONT, TAIL, KEEP = 8, 8, 4

-- The j-th slot of the string (1-based): at, n.
local function mslot(v, j) return unpack_s(SLOT, v, 16 * j + 33) end

-- Reads a window's string v (false: none) into w.
local function wopen(w, v)
  if v and #v >= HLEN and (#v - HLEN) % 16 == 0 then
    w.sum, w.made, w.gone, w.a, w.ln, w.le = unpack_s(HEAD, v)
    w.v, w.m = v, (#v - HLEN) / 16
    -- (Anything else is not this layout: as a fresh window.)
    if w.ln == 0 then w.a = w.m end
    if w.a >= 0 and w.a <= w.m and w.ln >= 0 and (w.ln == 0 or w.a < w.m) then return end
  end
  w.sum, w.made, w.gone, w.a, w.ln, w.le = 0, 0, 0, 0, 0, 0
  w.v, w.m = '', 0
end

-- The list is gone (evicted, or deleted by hand): the window is what
-- the string holds, and no admission counted before its tail is given
-- back (gone: its slot may have been in the list).
local function wrepair(w)
  local v, sum = w.v, 0
  for j = 1, w.m do
    local _, c = mslot(v, j)
    sum = sum + c
  end
  if w.a < w.m then w.gone = max(w.gone, mslot(v, w.a + 1) - 1) end
  w.a, w.ln, w.le, w.sum, w.chunk, w.dirty = w.m, 0, 0, sum, nil, true
end

-- The p-th slot of the window, oldest first (1-based): at, n; nil when
-- the list is gone. The list is read FRONT elements at a time.
local function qslot(w, p)
  if p <= w.a then return unpack_s(SLOT, w.v, 16 * p + 33) end
  local q = p - w.a
  if q > w.ln then return unpack_s(SLOT, w.v, 16 * (p - w.ln) + 33) end
  local c = w.chunk
  if not c or q <= w.c0 or q > w.c0 + #c then
    c = redis.call('LRANGE', w.l, int(q - 1), int(q + FRONT - 2))
    w.chunk, w.c0 = c, q - 1
  end
  local s = c[q - w.c0]
  if not s or #s ~= 16 then return nil end
  return unpack_s(SLOT, s)
end

-- Drops (from the sums) the slots that have left the window (now -
-- window, now]: w.drop of them, oldest first; w.size live slots are left,
-- the oldest at w.oldest.
local function wexpire(w, edge)
  local total, p, sum = w.m + w.ln, 1, w.sum
  local at, c
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
  w.sum, w.drop, w.size = sum, p - 1, total - p + 1
  if p <= total then w.oldest = at else w.oldest = nil end
end

-- Where an admission at now is counted (limits/window.go's place): the
-- time it is counted at and whether it joins the newest slot.
local function wplace(w, limit, window)
  if w.size == 0 then return now, false end
  local newest = unpack_s('<d', w.v, 16 * w.m + 33)
  local at, tie = now, now <= newest
  if newest > at then at = newest end -- a clock gone backwards keeps the order
  if tie then return at, true end
  if limit > maxslots then
    if w.size >= maxslots + 1 then return at, true end
    local g = max(floor(window / maxslots), 1)
    return at, floor(newest / g) == floor(at / g)
  end
  return at, w.size >= max(min(limit, maxslots), 1)
end

-- Writes the window back: its first w.drop slots dropped, its newest slot
-- replaced by last and add appended (packed slots, or nil); ttl: the
-- string's expiry, ms (nil keeps it). The list is touched only when the
-- front runs out or a slot moves past the tail.
local function wsave(w, last, add, ttl)
  local v, m, a, ln, drop = w.v, w.m, w.a, w.ln, w.drop
  local dF = min(drop, a)
  local dL = min(drop - dF, ln)
  local dT = drop - dF - dL
  local keep = m
  if last then keep = m - 1 end
  local na, nl, body
  if dL == 0 and (ln == 0 or a > dF) then
    -- The list stays as it is: the slots kept are one run of the string.
    local grow = 0
    if add then grow = 1 end
    if ln == 0 then
      na = m - dF + grow
      if na > FRONT + TAIL then na = nil end
    elseif m - a + grow <= TAIL then
      na = a - dF
    end
    if na then
      nl = ln
      body = sub(v, HLEN + 16 * dF + 1, HLEN + 16 * keep) .. (last or '') .. (add or '')
    end
  end
  if not body then
    -- The slots of the string, oldest first, the list's place after na.
    local s = {}
    for j = dF + 1, a do s[#s + 1] = sub(v, 16 * j + 33, 16 * j + 48) end
    na = #s
    for j = a + dT + 1, m do s[#s + 1] = sub(v, 16 * j + 33, 16 * j + 48) end
    if last then s[#s] = last end
    if add then s[#s + 1] = add end
    nl = ln - dL
    if dL > 0 then
      if nl == 0 then redis.call('DEL', w.l) else redis.call('LTRIM', w.l, int(dL), '-1') end
    end
    if nl > 0 and na == 0 then
      -- The front ran out: the list's oldest become the front.
      local c = redis.call('LRANGE', w.l, '0', int(FRONT - 1))
      if #c == nl then redis.call('DEL', w.l) else redis.call('LTRIM', w.l, int(#c), '-1') end
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
        redis.call('DEL', w.l) -- a list left by a counter of before (evicted string)
        w.le = 0
      end
      local moved = {}
      for j = from, to do moved[#moved + 1] = s[j] end
      redis.call('RPUSH', w.l, unpack(moved))
      nl = nl + #moved
      -- It lives as long as its newest slot is in the window: set to one
      -- window past the string's expiry (ttl: this is an admission), so
      -- that once a window is enough. (A list left behind by a string
      -- gone before it is deleted above when a list starts again.)
      if w.le < unpack_s('<d', moved[#moved]) + w.window then
        local ms = tonumber(ttl) + math.ceil(w.window / 1000)
        redis.call('PEXPIRE', w.l, int(ms))
        w.le = now + ms * 1000
      end
      local t = {}
      for j = 1, from - 1 do t[#t + 1] = s[j] end
      for j = to + 1, #s do t[#t + 1] = s[j] end
      s = t
    end
    if nl == 0 then
      na, w.le = #s, 0
    end
    body = table.concat(s)
  end
  local value = pack(HEAD, w.sum, w.made, w.gone, na, nl, w.le) .. body
  if ttl then
    redis.call('SET', w.w, value, 'PX', ttl)
  else
    redis.call('SET', w.w, value, 'KEEPTTL')
  end
end
-- window end

-- Give back units of the admission counted at rec (µs) in window w, at
-- is rec, or 0 for a rollback (not checked: just after the decision).
local function wrefund(w, rec, at, units)
  if w.m == 0 then return 0 end
  if at > 0 then
    if w.made > at then return 0 end -- another counter
    -- Slots counted then were dropped (at a clock read later than now):
    -- as limits/window.go, which cannot tell its slots apart, does not
    -- give back.
    if w.gone >= at then return 0 end
  end
  -- The first slot counted at or after rec, looked for from the newest:
  -- j in the string, or q in the list.
  local v, m, a, ln = w.v, w.m, w.a, w.ln
  local j, q, lv
  local lo = a + 1
  if ln == 0 then lo = 1 end
  for i = m, lo, -1 do
    if mslot(v, i) < rec then break end
    j = i
  end
  if j == lo and ln > 0 then
    -- The whole tail is later: the list, from its newest, then the front.
    local upto, done = ln, false
    while upto > 0 and not done do
      local from = max(upto - FRONT + 1, 1)
      local c = redis.call('LRANGE', w.l, int(from - 1), int(upto - 1))
      if #c ~= upto - from + 1 then
        -- The list is gone: what is left, written back, decides.
        wrepair(w)
        if wrefund(w, rec, at, units) == 1 then return 1 end
        redis.call('SET', w.w, pack(HEAD, w.sum, w.made, w.gone, w.a, w.ln, w.le) .. sub(w.v, HLEN + 1), 'KEEPTTL')
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
  elseif j then
    t, held = mslot(v, j)
  else
    return 0
  end
  if units > held then units = held end
  if q then
    if units == held then
      redis.call('LREM', w.l, '1', lv)
      ln = ln - 1
    else
      redis.call('LSET', w.l, int(q - 1), pack(SLOT, t, held - units))
    end
  else
    local at0 = 16 * j + 33
    if units == held then
      v = sub(v, 1, at0 - 1) .. sub(v, at0 + 16)
      m = m - 1
      if j <= a then a = a - 1 end
      if ln > 0 and a == m then
        -- The tail is empty: the list's newest slot is the newest.
        local s = redis.call('RPOP', w.l)
        if s and #s == 16 then
          v, m, ln = v .. s, m + 1, ln - 1
        else
          ln = 0
        end
      end
    else
      v = sub(v, 1, at0 - 1) .. pack(SLOT, t, held - units) .. sub(v, at0 + 16)
    end
  end
  if ln == 0 then a, w.le = m, 0 end
  w.sum = max(w.sum - units, 0)
  redis.call('SET', w.w, pack(HEAD, w.sum, w.made, w.gone, a, ln, w.le) .. sub(v, HLEN + 1), 'KEEPTTL')
  return 1
end

local function refundWindow(w, rec, at, units)
  if at > 0 and at + w.window <= now then return 0 end -- left the window
  wopen(w, redis.call('GET', w.w))
  return wrefund(w, rec, at, units)
end

-- Count units at now in window w, as redis.lua counts an admission
-- (evalWindow and takeWindow in mode 0): first forget the slots that have
-- left the window, then count in the newest slot or a new one as
-- limits/window.go's place says.
local function chargeWindow(w, units, limit)
  wopen(w, redis.call('GET', w.w))
  local edge = now - w.window
  wexpire(w, edge)
  if w.drop > 0 then w.gone = max(w.gone, edge) end
  local at, merge = wplace(w, limit, w.window)
  w.sum = w.sum + units
  if w.made == 0 then w.made = at end
  -- The string expires one window after this charge, as takeWindow's.
  local ttl = int(math.ceil((at - now + w.window) / 1000))
  if merge then
    local _, c = mslot(w.v, w.m)
    wsave(w, pack(SLOT, at, c + units), nil, ttl)
  else
    wsave(w, nil, pack(SLOT, at, units), ttl)
  end
end

local function refundBucket(b, units, burst)
  local s = redis.call('GET', b)
  local tokens, last
  if s then tokens, last = string.match(s, '^(%S+) (%S+)$') end
  if tonumber(tokens) == nil or last == nil then return 0 end
  tokens = tonumber(tokens) + units
  if tokens > burst then tokens = burst end
  -- The bucket keeps its time and its expiry (it is full sooner: the
  -- expiry covers it).
  local v = string.format('%.17g', tokens) .. ' ' .. last
  local ttl = redis.call('PTTL', b)
  if ttl > 0 then
    redis.call('SET', b, v, 'PX', ttl)
  else
    redis.call('SET', b, v)
  end
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
  local s = redis.call('GET', b)
  local tokens, last
  if s then
    local t, l = string.match(s, '^(%S+) (%S+)$')
    tokens, last = tonumber(t), tonumber(l)
  end
  if not tokens or not last then tokens, last = burst, now end -- a fresh bucket is full
  if tokens > burst then tokens = burst end
  local e = now - last
  if e < 0 then e = 0 end
  tokens = fill(tokens, e, limit, window, burst) - units
  if now > last then last = now end
  local full = 1e15
  if limit > 0 then full = math.min((burst - tokens) * window / limit, 1e15) end
  redis.call('SET', b, string.format('%.17g %.17g', tokens, last), 'PX', math.ceil(full / 1000) + 1000)
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
    local w = {w = KEYS[k], l = KEYS[k + 1], window = window}
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
