-- Decide a batch of hits atomically (ratelimit-proxy): sliding windows,
-- token buckets and calendar counters, on Redis's clock (a calendar
-- counter's period comes from the caller).
--
-- ARGV: [1] number of hits, [2] now in µs (0: Redis's TIME), [3] mode:
--   0 decide: when every enforcing (non-shadow) hit admits, record the
--     batch: every enforcing hit, and each shadow hit that fits;
--   1 peek: answer exactly as mode 0 would, recording nothing;
--   2 refused: the batch is refused already (an earlier part of a split
--     batch refused): answer as is, recording nothing;
-- [4] maxSlots, [5] marks: 0 none (a single server), 1 each hit's counter
-- keys are followed by its pending mark's key (a Cluster), 2 as 1, and
-- each hit recorded sets its pending mark: this part of a split batch may
-- still be rolled back; [6] how long a pending mark lasts, ms (it outlasts
-- the rollback of the charge it marks); then per hit its algorithm ("w":
-- sliding window, "b": token bucket, "c": calendar; in capitals for a
-- shadow rule), limit and, a window: its length (µs) and the cost; a
-- bucket: its window (µs), the cost and its burst; a calendar counter:
-- its current period's start (unix s), the cost and how long its key
-- lives when written in this period (s: to the period's end and a
-- margin).
--
-- KEYS, per hit in order: a sliding window's string and list (below); a
-- token bucket's one string key (its tokens and their time, see bread); a
-- calendar counter's one string key, "start count made" (the period
-- counted in, unix s, the cost counted in it, and when the counter of
-- that period was made, µs, so that a settlement recognises a counter
-- made again after a Reset: an older period reads as zero; a later one,
-- written by an instance whose clock is ahead, is the one counted in);
-- then, with marks, the counter's pending mark (a key that exists while a
-- charge recorded by a part of a split batch may still be rolled back).
-- Every counter's first key is a string: one MGET reads them all.
--
-- A sliding window is limits/window.go's ring of slots, oldest first,
-- each (at, n): the time of its latest admission (µs) and the units
-- counted in it (at least 1); no two slots share a time, so a time names
-- a slot. Its string key holds a header, struct "<ddddddddd": sum (the
-- units of live slots), made (when the counter was made, µs, 0 unknown: a
-- settlement recognises a counter made after its admission, after a
-- Reset), gone (the latest time up to which slots were dropped as
-- expired, µs: a settlement knows an admission counted then or before may
-- have lost its slot), front and listed (below), listUntil (the list's
-- expiry as last set, µs), until (the string's, µs) and the newest slot;
-- then the other slots, struct "<dd" each. It holds every slot while
-- there are at most FRONT + TAIL + 1; past that the oldest FRONT (the
-- front), the newest, and before it a tail of up to TAIL, and the slots
-- between front and tail are in the list key, oldest first (`listed` of
-- them, one 16-byte element each; a tail past TAIL keeps its newest KEEP
-- and the others go to the list). So the string stays at most 328 bytes
-- whatever the window holds: an admission reads it whole (one MGET for
-- the batch) and writes it whole (one SET), or, joining the newest slot
-- while the string's expiry covers it, writes the header alone (one
-- SETRANGE); the list is touched only when the tail moves to it (RPUSH)
-- or the front runs out (LRANGE, LTRIM). The string expires a window and
-- a thousandth after its newest slot (the admissions joining that slot in
-- its thousandth need not move it); the list lives as long as its newest
-- slot is in the window, and at most a window longer than the string.
--
-- Returns one string of doubles ("<d" each): allowed (1/0: every
-- enforcing hit admits), now (µs), then 6 per hit: allowed (1 admits, 0
-- refuses, -1 refuses while the counter holds a charge that may still be
-- rolled back: the refusal may not last) and what was recorded, which
-- settle.lua takes to settle or roll back the admission (for a window the
-- time it was counted at, µs: the slot is the first at or after it; for
-- a bucket 1; 0 when nothing was), then for a window: remaining, retry
-- after, reset after, next after (µs); for a bucket: its state as read
-- (tokens, NaN for a fresh bucket, and its time, µs) and two zeros; for a
-- calendar counter: the count read in the period counted in, when its
-- counter was made (µs, 0 for none), then two zeros (what was recorded is
-- that period's start). One string costs the script and the client far
-- less than numbers one by one. The store computes a bucket's numbers
-- from its state with limits/bucket.go, which holds the same arithmetic
-- as fill below (and settle.lua's).
--
-- Sliding window: as limits/window.go, a limit up to maxSlots gives every
-- admission its own slot (exact), but one counted at the newest slot's
-- time joins it (they leave together); a larger limit groups admissions in
-- 1/maxSlots of the window, each group leaving the window with its latest
-- admission (never admits more). Work is bounded by what the hit needs,
-- never by the window's contents: a refusal reads the oldest slots that
-- must leave for the cost to fit (one, for a request of cost 1: the first
-- live one, read already), so the over-limit caller's hot path costs
-- Redis no more than an admission. A window's admission costs one SET or
-- SETRANGE (past FRONT + TAIL + 1 slots, an RPUSH every few new slots, an
-- LRANGE and an LTRIM every FRONT expired ones), its refusal nothing but
-- its share of the MGET (the list read past the front's slots), a
-- bucket's admission one SET, its refusal nothing (one more command for a
-- pending mark on a Cluster): each hit of a batch adds about one command
-- to the one round trip. Inside a script each command costs about a
-- microsecond, each number passed to one as much again (see int below),
-- and each string the script makes about a nanosecond a byte (Redis's Lua
-- hashes every byte of a new string): the reads and writes are whole
-- small strings, the reply one string.
--
-- Token bucket: the bucket starts full at burst, refills at limit per
-- window lazily and never above burst, admits a cost it holds, keeps
-- fractional tokens, and gains nothing from a clock going backwards (the
-- stored time never moves back). A refused or peeked bucket is not
-- written.
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
-- A number passed to redis.call is formatted with %.17g by Redis 7.0,
-- about half a microsecond each: integers are passed as strings made
-- with %d (the same digits, a twentieth of the cost), constants as
-- strings.
local fmt = string.format
local function int(x) return fmt('%d', x) end
local mode = tonumber(ARGV[3])
local maxslots = tonumber(ARGV[4])
local marks = tonumber(ARGV[5])
local max, min, floor = math.max, math.min, math.floor
local sub, pack, unpack_s = string.sub, struct.pack, struct.unpack

-- A hit is an array made at its full size (a table's named fields cost
-- a script twice as much, and so would naming its indices: each local a
-- function uses is an upvalue to capture on every call). Every hit's
-- first: [1] its (first) key, [2] its window (µs), [3] its algorithm,
-- [4] shadow, [5] limit, [6] cost, [7] its pending mark's key, [8]
-- allowed, [9] what was recorded (see Returns).

-- ---- A sliding window's keys (the same in settle.lua, checked by a test).
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

-- A hit's other fields: a window's answer, [28] retry, [29] reset and
-- [30] next after (µs), and [31] whether it was written; a bucket's [10]
-- burst, its state as read, [11] tokens and [12] time (false: none), and
-- [13] its level; a calendar counter's [10] period start, [11] key expiry
-- (s), [12] count read, [13] when its counter was made and [14] whether
-- it counts a later period.

local function evalWindow(hit, v)
  wopen(hit, v)
  local span, cost, limit = hit[2], hit[6], hit[5]
  local edge = now - span
  wexpire(hit, edge)
  if hit[22] > 0 then hit[15] = max(hit[15], edge) end
  local sum = hit[13]
  -- A settled charge may have taken the sum past the limit; a cost of 0
  -- still reads the state.
  hit[8] = cost == 0 or sum + cost <= limit
  if hit[8] then return end
  hit[28] = span
  if cost > limit or hit[23] == 0 then return end
  -- The wait until enough of the oldest slots leave for cost to fit.
  -- Every live slot holds at least one unit, so the slot that frees
  -- enough is among the first `need`: one, for a request of cost 1, and
  -- that one is read already.
  local need = sum + cost - limit
  if need <= 1 then
    hit[28] = max(hit[24] + span - now, 1)
    return
  end
  local freed, p, total = 0, hit[22] + 1, hit[22] + hit[23]
  while p <= total do
    local at, c = qslot(hit, p)
    if not at then return end -- the list is gone: answered by the window
    freed = freed + c
    if freed >= need then
      hit[28] = max(at + span - now, 1)
      return
    end
    p = p + 1
  end
end

-- Count (mode 0) or preview (mode 1) the admission of a window hit.
local function takeWindow(hit)
  local span, cost = hit[2], hit[6]
  local at, merge = wplace(hit, hit[5])
  hit[13] = hit[13] + cost
  hit[29] = at + span - now
  -- The oldest live slot once counted: the oldest now, unless this
  -- admission joins the only one, which moves to `at`.
  local oldest = hit[24] or at
  if merge and hit[23] == 1 then oldest = at end
  hit[30] = max(oldest + span - now, 0)
  if mode ~= 0 then return end
  if hit[14] == 0 then hit[14] = at end
  hit[9] = at
  if merge then
    wsave(hit, at, hit[21] + cost, false, true)
  else
    wsave(hit, at, cost, true, true)
  end
  hit[31] = true
end

-- Reset and next after of a window hit not counted.
local function reportWindow(hit)
  if hit[23] > 0 then
    hit[29] = max(hit[20] + hit[2] - now, 0)
    hit[30] = max(hit[24] + hit[2] - now, 0)
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

-- The level of a bucket `elapsed` µs (>= 0) after it held tokens (below
-- 0: a debt): limits/bucket.go's fill, the same operations in the same
-- order (settle.lua has a copy).
local function fill(tokens, elapsed, limit, window, burst)
  local add = elapsed * limit / window
  local room = burst
  if tokens < 0 then room = burst - tokens end
  if add > room then return burst end -- days of idle fill it
  local t = tokens + add
  if t > burst then t = burst end
  return t
end

local function evalBucket(hit, s)
  local tokens, last = bread(s)
  local burst = hit[10]
  if tokens and last then
    hit[11], hit[12] = tokens, last
  else
    tokens, last = burst, now -- a fresh bucket is full
  end
  if tokens > burst then tokens = burst end
  local e = now - last
  if e < 0 then e = 0 end
  local level = fill(tokens, e, hit[5], hit[2], burst)
  hit[13] = level
  hit[8] = hit[6] == 0 or (hit[5] > 0 and level >= hit[6])
end

-- Take the cost of an admitted bucket hit (mode 0).
local function takeBucket(hit)
  local tokens, last = hit[13] - hit[6], hit[12] or now
  if now > last then last = now end -- never moves backwards
  -- Kept until full again (no need to be exact: the margin covers it).
  local full = min((hit[10] - tokens) * hit[2] / hit[5], 1e15)
  redis.call('SET', hit[1], bvalue(tokens, last), 'PX', int(math.ceil(full / 1000) + 1000))
  hit[9] = 1
end

-- A calendar counter: the cost counted since its period began.
local function evalCalendar(hit, s)
  if s then
    local start, count, made = string.match(s, '^(%S+) (%S+) (%S+)$')
    start, count = tonumber(start), tonumber(count)
    if start and count and start >= hit[10] then
      hit[12], hit[13] = count, tonumber(made) or 0
      if start > hit[10] then hit[10], hit[14] = start, true end
    end
  end
  hit[8] = hit[6] == 0 or hit[12] + hit[6] <= hit[5]
end

-- Count the cost of an admitted calendar hit (mode 0); the key lives until
-- its period's end and a margin (a later period's keeps its own).
local function takeCalendar(hit)
  if hit[13] == 0 then hit[13] = now end
  local v = fmt('%d %d %d', hit[10], hit[12] + hit[6], hit[13])
  if hit[14] then
    redis.call('SET', hit[1], v, 'KEEPTTL')
  else
    redis.call('SET', hit[1], v, 'EX', hit[11])
  end
  hit[9] = hit[10]
end

-- A hit's answer: verdict, what was recorded, then four numbers (below).
local REPLY = '<dddddd'

local ok = true
local hits, first = {}, {}
local k, a = 1, 7
for i = 1, n do
  local alg, hit = ARGV[a]
  if alg == 'w' or alg == 'W' then
    -- [1] to [9], then [10] to [31] (see above)
    hit = {KEYS[k], tonumber(ARGV[a + 2]), 'w', alg == 'W', tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), false, false, 0,
           KEYS[k + 1], '', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, false, false, 0, false, 0, 0, 0, false}
    a, k = a + 4, k + 2
  elseif alg == 'b' or alg == 'B' then
    -- [1] to [9], then [10] to [13]
    hit = {KEYS[k], tonumber(ARGV[a + 2]), 'b', alg == 'B', tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), false, false, 0,
           tonumber(ARGV[a + 4]), false, false, 0}
    a, k = a + 5, k + 1
  else
    -- [1] to [9] ([2] unused), then [10] to [14]
    hit = {KEYS[k], 0, 'c', alg == 'C', tonumber(ARGV[a + 1]), tonumber(ARGV[a + 3]), false, false, 0,
           tonumber(ARGV[a + 2]), ARGV[a + 4], 0, 0, false}
    a, k = a + 5, k + 1
  end
  first[i] = hit[1]
  if marks > 0 then
    hit[7] = KEYS[k]
    k = k + 1
  end
  hits[i] = hit
end
local values = redis.call('MGET', unpack(first))
for i = 1, n do
  local hit = hits[i]
  local alg = hit[3]
  if alg == 'w' then
    evalWindow(hit, values[i])
  elseif alg == 'b' then
    evalBucket(hit, values[i])
  else
    evalCalendar(hit, values[i])
  end
  if not hit[8] and not hit[4] then ok = false end
end

-- Clamping hits (SPEC §8.2): after the hits, ARGV holds their number,
-- the batch's output asked for and its minimum, then per clamping hit its
-- index, base cost and cost per output token. When one of them has less
-- left than its cost, the output is lowered to the largest that fits on
-- every one (limits/limits.go's Clamp.fits: the same float operations),
-- and each is charged its base plus that output's price, here, in the
-- step that read what remains. Returned after the hits: the output (-1
-- when nothing was lowered), then each clamping hit's cost.
local nc = tonumber(ARGV[a]) or 0
local outcap = -1
if nc > 0 and mode ~= 2 then
  local maxo, mino = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local o = maxo
  for j = 1, nc do
    local b = a + 3 * j
    local hit, base, per = hits[tonumber(ARGV[b])], tonumber(ARGV[b + 1]), tonumber(ARGV[b + 2])
    local avail, alg = 0, hit[3]
    if alg == 'b' then
      if hit[5] > 0 then avail = max(floor(hit[13]), 0) end
    elseif alg == 'w' then
      avail = max(hit[5] - hit[13], 0)
    else
      avail = max(hit[5] - hit[12], 0)
    end
    local q = floor((avail - base) / per)
    local f
    if q >= maxo then
      f = maxo
    elseif q < -1 then
      f = -1
    else
      f = q
      local tries = 0
      while f >= 0 and base + math.ceil(f * per) > avail do
        if tries == 2 then f = -1 break end
        f = f - 1
        tries = tries + 1
      end
    end
    if f < o then o = f end
  end
  if o < maxo and o >= mino then
    outcap = o
    ok = true
    for j = 1, nc do
      local b = a + 3 * j
      local hit = hits[tonumber(ARGV[b])]
      hit[6] = tonumber(ARGV[b + 1]) + math.ceil(o * tonumber(ARGV[b + 2]))
      hit[8] = true
      if hit[3] == 'w' then hit[28] = 0 end
    end
    for i = 1, n do
      if not hits[i][8] and not hits[i][4] then ok = false end
    end
  end
end
local out = {pack('<dd', ok and 1 or 0, now)}
for i = 1, n do
  local hit = hits[i]
  local alg = hit[3]
  local take = ok and mode ~= 2 and hit[8] and hit[6] > 0
  if alg == 'w' then
    if take then takeWindow(hit) else reportWindow(hit) end
    -- Slots that left the window are dropped (and a lost list forgotten)
    -- by a decision whatever its verdict, as limits/window.go does.
    if mode == 0 and not hit[31] and (hit[22] > 0 or hit[27]) then wsave(hit) end
  elseif take and mode == 0 then
    if alg == 'b' then takeBucket(hit) else takeCalendar(hit) end
  end
  if marks == 2 and hit[9] ~= 0 then
    redis.call('SET', hit[7], '1', 'PX', ARGV[6])
  end
  local verdict = 1
  if not hit[8] then
    verdict = 0
    if marks > 0 and not hit[4] and redis.call('EXISTS', hit[7]) == 1 then verdict = -1 end
  end
  if alg == 'w' then
    out[i + 1] = pack(REPLY, verdict, hit[9], max(hit[5] - hit[13], 0), hit[28], hit[29], hit[30])
  elseif alg == 'b' then
    out[i + 1] = pack(REPLY, verdict, hit[9], hit[11] or 0 / 0, hit[12] or 0, 0, 0)
  else
    out[i + 1] = pack(REPLY, verdict, hit[9], hit[12], hit[13], 0, 0)
  end
end
if nc > 0 then
  out[#out + 1] = pack('<d', outcap)
  for j = 1, nc do
    out[#out + 1] = pack('<d', hits[tonumber(ARGV[a + 3 * j])][6])
  end
end
return table.concat(out)
