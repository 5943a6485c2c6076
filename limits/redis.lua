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
-- token bucket's one string key, "tokens last" (the tokens, fractional, as
-- %.17g, at `last`, in µs; below 0 after a settled charge, a debt); a
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
-- a slot. Its string key holds a header, struct "<dddddd": sum (the units
-- of live slots), made (when the counter was made, µs, 0 unknown: a
-- settlement recognises a counter made after its admission, after a
-- Reset), gone (the latest time up to which slots were dropped as
-- expired, µs: a settlement knows an admission counted then or before may
-- have lost its slot), front, listed (below) and listUntil (the list's
-- expiry as last set, µs); then slots, struct "<dd" each. It holds every
-- slot while there are at most FRONT + TAIL; past that the oldest FRONT
-- (the front) and the newest TAIL at most (at least one), and the slots
-- between them are in the list key, oldest first (`listed` of them, one
-- 16-byte element each): the string stays a few hundred bytes whatever
-- the window holds, and an admission reads and writes it whole (one MGET
-- for the batch, one SET per hit), touching the list only when a slot
-- moves past the tail (RPUSH) or the front runs out (LRANGE, LTRIM).
-- The list never outlives the string (its expiry is the string's as set
-- when it grew), and lives as long as its newest slot is in the window.
--
-- Returns: allowed (1/0: every enforcing hit admits), now (µs), then 6
-- values per hit: allowed (1 admits, 0 refuses, -1 refuses while the
-- counter holds a charge that may still be rolled back: the refusal may
-- not last) and what was recorded, which settle.lua takes to settle or
-- roll back the admission (for a window the time it was counted at, µs:
-- the slot is the first at or after it; for a bucket 1; 0 when nothing
-- was), then for a window: remaining, retry after, reset after, next after
-- (µs); for a bucket: its state as read ("tokens last", or "" for a fresh
-- bucket) and three zeros; for a calendar counter: the count read in the
-- period counted in, when its counter was made (µs, 0 for none), then two
-- zeros (what was recorded is that period's start). The store computes a
-- bucket's numbers from its state with limits/bucket.go, which holds the
-- same arithmetic as fill below (and settle.lua's).
--
-- Sliding window: as limits/window.go, a limit up to maxSlots gives every
-- admission its own slot (exact), but one counted at the newest slot's
-- time joins it (they leave together); a larger limit groups admissions in
-- 1/maxSlots of the window, each group leaving the window with its latest
-- admission (never admits more). Work is bounded by what the hit needs,
-- never by the window's contents: a refusal reads the oldest slots that
-- must leave for the cost to fit (one, for a request of cost 1: the first
-- live one, read already), so the over-limit caller's hot path costs
-- Redis no more than an admission. A window's admission costs one SET
-- (and, past FRONT + TAIL slots, an RPUSH; every FRONT expired slots an
-- LRANGE and an LTRIM), its refusal nothing but its share of the MGET, a
-- bucket's admission one SET, its refusal nothing (one more command for a
-- pending mark on a Cluster): each hit of a batch adds at most a few
-- commands to the one round trip. Inside a script each command costs
-- about a microsecond, and each number passed to one as much again (see
-- int below).
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

-- ---- A sliding window's keys (the same in settle.lua, checked by a test).
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

local function evalWindow(hit, v)
  wopen(hit, v)
  local edge = now - hit.window
  wexpire(hit, edge)
  if hit.drop > 0 then hit.gone = max(hit.gone, edge) end
  local sum = hit.sum
  -- A settled charge may have taken the sum past the limit; a cost of 0
  -- still reads the state.
  hit.allowed = hit.cost == 0 or sum + hit.cost <= hit.limit
  if hit.allowed then return end
  hit.retry = hit.window
  if hit.cost > hit.limit or hit.size == 0 then return end
  -- The wait until enough of the oldest slots leave for cost to fit.
  -- Every live slot holds at least one unit, so the slot that frees
  -- enough is among the first `need`: one, for a request of cost 1, and
  -- that one is read already.
  local need = sum + hit.cost - hit.limit
  if need <= 1 then
    hit.retry = max(hit.oldest + hit.window - now, 1)
    return
  end
  local freed, p, total = 0, hit.drop + 1, hit.m + hit.ln
  while p <= total do
    local at, c = qslot(hit, p)
    if not at then return end -- the list is gone: answered by the window
    freed = freed + c
    if freed >= need then
      hit.retry = max(at + hit.window - now, 1)
      return
    end
    p = p + 1
  end
end

-- Count (mode 0) or preview (mode 1) the admission of a window hit.
local function takeWindow(hit)
  local at, merge = wplace(hit, hit.limit, hit.window)
  hit.sum = hit.sum + hit.cost
  hit.reset = at + hit.window - now
  -- The oldest live slot once counted: the oldest now, unless this
  -- admission joins the only one, which moves to `at`.
  local oldest = hit.oldest or at
  if merge and hit.size == 1 then oldest = at end
  hit.nxt = max(oldest + hit.window - now, 0)
  if mode ~= 0 then return end
  -- The string expires one window after this admission: its slot leaves
  -- the window then, the last of them (a slot leaves with its latest
  -- admission), so nothing is left to keep.
  local ttl = int(math.ceil((at - now + hit.window) / 1000))
  if hit.made == 0 then hit.made = at end
  hit.rec = at
  if merge then
    local _, c = mslot(hit.v, hit.m)
    wsave(hit, pack(SLOT, at, c + hit.cost), nil, ttl)
  else
    wsave(hit, nil, pack(SLOT, at, hit.cost), ttl)
  end
  hit.saved = true
end

-- Reset and next after of a window hit not counted.
local function reportWindow(hit)
  if hit.size > 0 then
    hit.reset = max(unpack_s('<d', hit.v, 16 * hit.m + 33) + hit.window - now, 0)
    hit.nxt = max(hit.oldest + hit.window - now, 0)
  end
end

-- The level of bucket hit `elapsed` µs (>= 0) after it held hit.tokens
-- (below 0: a debt): limits/bucket.go's fill, the same operations in the
-- same order (settle.lua has a copy).
local function fill(hit, elapsed)
  local add = elapsed * hit.limit / hit.window
  local room = hit.burst
  if hit.tokens < 0 then room = hit.burst - hit.tokens end
  if add > room then return hit.burst end -- days of idle fill it
  local t = hit.tokens + add
  if t > hit.burst then t = hit.burst end
  return t
end

local function evalBucket(hit, s)
  if s then
    local tokens, last = string.match(s, '^(%S+) (%S+)$')
    hit.tokens, hit.last = tonumber(tokens), tonumber(last)
  end
  if not hit.tokens or not hit.last then
    s = ''
    hit.tokens, hit.last = hit.burst, now -- a fresh bucket is full
  end
  hit.state = s
  if hit.tokens > hit.burst then hit.tokens = hit.burst end
  local e = now - hit.last
  if e < 0 then e = 0 end
  hit.level = fill(hit, e)
  hit.allowed = hit.cost == 0 or (hit.limit > 0 and hit.level >= hit.cost)
end

-- Take the cost of an admitted bucket hit (mode 0).
local function takeBucket(hit)
  local tokens, last = hit.level - hit.cost, hit.last
  if now > last then last = now end -- never moves backwards
  -- Kept until full again (no need to be exact: the margin covers it).
  local full = min((hit.burst - tokens) * hit.window / hit.limit, 1e15)
  -- %.17g writes an integer's digits as %d does, far slower.
  local f = '%.17g %d'
  if tokens == floor(tokens) and tokens > -1e15 and tokens < 1e15 then f = '%d %d' end
  redis.call('SET', hit.b, fmt(f, tokens, last), 'PX', int(math.ceil(full / 1000) + 1000))
  hit.rec = 1
end

-- A calendar counter: the cost counted since its period began.
local function evalCalendar(hit, s)
  hit.sum = 0
  if s then
    local start, count, made = string.match(s, '^(%S+) (%S+) (%S+)$')
    start, count = tonumber(start), tonumber(count)
    if start and count and start >= hit.start then
      hit.sum, hit.made = count, tonumber(made)
      if start > hit.start then hit.start, hit.later = start, true end
    end
  end
  hit.allowed = hit.cost == 0 or hit.sum + hit.cost <= hit.limit
end

-- Count the cost of an admitted calendar hit (mode 0); the key lives until
-- its period's end and a margin (a later period's keeps its own).
local function takeCalendar(hit)
  if not hit.made then hit.made = now end
  local v = fmt('%d %d %d', hit.start, hit.sum + hit.cost, hit.made)
  if hit.later then
    redis.call('SET', hit.c, v, 'KEEPTTL')
  else
    redis.call('SET', hit.c, v, 'EX', hit.expire)
  end
  hit.rec = hit.start
end

local ok = true
local hits, first = {}, {}
local k, a = 1, 7
for i = 1, n do
  -- Each table is made with every field it will hold: it never grows.
  local alg, hit = ARGV[a]
  if alg == 'w' or alg == 'W' then
    hit = {alg = 'w', shadow = alg == 'W', limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
           cost = tonumber(ARGV[a + 3]), w = KEYS[k], l = KEYS[k + 1], p = false,
           allowed = false, retry = 0, reset = 0, nxt = 0, rec = 0, saved = false, dirty = false,
           v = '', m = 0, sum = 0, made = 0, gone = 0, a = 0, ln = 0, le = 0, drop = 0, size = 0,
           oldest = false, chunk = false, c0 = 0}
    first[i] = KEYS[k]
    a, k = a + 4, k + 2
  elseif alg == 'b' or alg == 'B' then
    hit = {alg = 'b', shadow = alg == 'B', limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
           cost = tonumber(ARGV[a + 3]), burst = tonumber(ARGV[a + 4]), b = KEYS[k], p = false,
           allowed = false, retry = 0, reset = 0, nxt = 0, rec = 0, tokens = false, last = false, state = '', level = 0}
    first[i] = KEYS[k]
    a, k = a + 5, k + 1
  else
    hit = {alg = 'c', shadow = alg == 'C', limit = tonumber(ARGV[a + 1]), start = tonumber(ARGV[a + 2]),
           cost = tonumber(ARGV[a + 3]), expire = ARGV[a + 4], c = KEYS[k], p = false,
           allowed = false, retry = 0, reset = 0, nxt = 0, rec = 0, sum = 0, made = false, later = false}
    first[i] = KEYS[k]
    a, k = a + 5, k + 1
  end
  if marks > 0 then
    hit.p = KEYS[k]
    k = k + 1
  end
  hits[i] = hit
end
local values = redis.call('MGET', unpack(first))
for i = 1, n do
  local hit = hits[i]
  if hit.alg == 'w' then
    evalWindow(hit, values[i])
  elseif hit.alg == 'b' then
    evalBucket(hit, values[i])
  else
    evalCalendar(hit, values[i])
  end
  if not hit.allowed and not hit.shadow then ok = false end
end

local out = {ok and 1 or 0, now}
for i = 1, n do
  local hit = hits[i]
  local take = ok and mode ~= 2 and hit.allowed and hit.cost > 0
  if hit.alg == 'w' then
    if take then takeWindow(hit) else reportWindow(hit) end
    -- Slots that left the window are dropped (and a gone list forgotten)
    -- by a decision whatever its verdict, as limits/window.go does.
    if mode == 0 and not hit.saved and (hit.drop > 0 or hit.dirty) then wsave(hit) end
  elseif take and mode == 0 then
    if hit.alg == 'b' then takeBucket(hit) else takeCalendar(hit) end
  end
  if marks == 2 and hit.rec ~= 0 then
    redis.call('SET', hit.p, '1', 'PX', ARGV[6])
  end
  local verdict = 1
  if not hit.allowed then
    verdict = 0
    if marks > 0 and not hit.shadow and redis.call('EXISTS', hit.p) == 1 then verdict = -1 end
  end
  out[#out + 1] = verdict
  out[#out + 1] = hit.rec
  if hit.alg == 'c' then
    out[#out + 1] = hit.sum
    out[#out + 1] = hit.made or 0
    out[#out + 1] = 0
    out[#out + 1] = 0
  elseif hit.alg == 'b' then
    out[#out + 1] = hit.state
    out[#out + 1] = 0
    out[#out + 1] = 0
    out[#out + 1] = 0
  else
    out[#out + 1] = max(hit.limit - hit.sum, 0)
    out[#out + 1] = hit.retry
    out[#out + 1] = hit.reset
    out[#out + 1] = hit.nxt
  end
end
return out
