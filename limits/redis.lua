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
-- the rollback of the charge it marks); then per hit: algorithm ("w":
-- sliding window, "b": token bucket, "c": calendar), shadow (1/0), limit,
-- window (µs; a calendar counter: its current period's start, unix s),
-- cost, burst (buckets only; a calendar counter: how long its key lives
-- when written in this period, s: to the period's end and a margin).
-- KEYS, per hit in order: a sliding window's sorted set of time slots
-- (member: slot id, score: the slot's latest admission, µs) and its hash
-- (slot id -> cost counted in it, at least 1; "s": the sum of live
-- slots; "q": a sequence; "n": the newest slot's time, µs; "g": when the
-- counter was made, µs, so that a settlement recognises a counter made
-- after its admission, after a Reset; "x": the latest time up to which slots were
-- dropped as expired, µs, so that a settlement knows an admission counted
-- then or before may have lost its slot); a token bucket's one string
-- key, "tokens last" (the tokens, fractional, as %.17g, at `last`, in µs;
-- below 0 after a settled charge, a debt); then, with marks, the counter's
-- calendar counter's one string key, "start count made" (the period
-- counted in, unix s, the cost counted in it, and when the counter of
-- that period was made, µs, so that a settlement recognises a counter
-- made again after a Reset: an older period reads as zero; a later one,
-- written by an instance whose clock is ahead, is the one counted in);
-- then, with marks, the counter's
-- pending mark (a key that exists while a charge recorded by a part of a
-- split batch may still be rolled back).
-- Returns: allowed (1/0: every enforcing hit admits), now (µs), then 6
-- values per hit: allowed (1 admits, 0 refuses, -1 refuses while the
-- counter holds a charge that may still be rolled back: the refusal may
-- not last) and what was recorded, which settle.lua
-- takes to settle or roll back the admission (for a window the slot: a
-- sequence number > 0, or -(bucket+1) for a grouped slot; for a bucket 1;
-- 0 when nothing was), then for a window: remaining, retry after, reset
-- after, next after (µs); for a bucket: its state as read ("tokens last",
-- or "" for a fresh bucket) and three zeros; for a calendar counter: the
-- count read in the period counted in, when its counter was made (µs, 0
-- for none), then two zeros (what was recorded is that period's start). The store computes a bucket's
-- numbers from its state with limits/bucket.go, which holds the same
-- arithmetic as fill below (and settle.lua's).
--
-- Sliding window: a limit up to maxSlots gives every admission its own
-- slot (exact), but one counted at the newest slot's time joins it (they
-- leave together), so that no two slots share a time, as in limits/
-- window.go; a larger limit groups admissions in 1/maxSlots of the
-- window, each group leaving the window with its latest admission (never
-- admits more). Work is bounded by what the hit needs, never by the
-- window's contents: a refusal reads the oldest slots that must leave for
-- the cost to fit (one, for a request of cost 1), so the over-limit
-- caller's hot path costs Redis no more than an admission. A window's
-- admission costs six commands (two of them push the keys' expiry to one
-- window after it; past maxSlots the group's count is read with the
-- others, so that recording it is one HSET), its refusal two; a bucket's
-- admission two, its refusal one (one more for a pending mark on a
-- Cluster): each hit of a batch adds a few commands to the one round trip.
-- Inside a script each command costs about a microsecond, and each number
-- passed to one as much again (see int below).
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
-- A slot id as tostring writes it (%.14g): the same as %d below 1e14.
local function slotid(x)
  if x < 1e14 then return fmt('%d', x) end
  return tostring(x)
end
local none = {}
local mode = tonumber(ARGV[3])
local maxslots = tonumber(ARGV[4])
local marks = tonumber(ARGV[5])

local function evalWindow(hit)
  local z, h = hit.z, hit.h
  local edge = now - hit.window
  hit.edge = edge
  local first = redis.call('ZRANGE', z, '0', '0', 'WITHSCORES')
  local fields
  if hit.limit > maxslots then
    -- A larger limit groups admissions: this one joins now's group, whose
    -- count is read here so that recording it is one HSET.
    hit.group = math.floor(now / math.max(math.floor(hit.window / maxslots), 1))
    hit.gid = 'g' .. slotid(hit.group)
    fields = redis.call('HMGET', h, 's', 'q', 'n', 'g', 'x', hit.gid)
    hit.held = tonumber(fields[6]) or 0
  else
    fields = redis.call('HMGET', h, 's', 'q', 'n', 'g', 'x')
  end
  local sum = tonumber(fields[1]) or 0
  hit.q, hit.newest = tonumber(fields[2]) or 0, tonumber(fields[3])
  hit.made = fields[4]
  if #first > 0 and tonumber(first[2]) <= edge then
    -- Forget the slots that have left the window (now - window, now]; a
    -- peek only leaves them out of its sums.
    local old = redis.call('ZRANGEBYSCORE', z, '-inf', int(edge))
    local counts = redis.call('HMGET', h, unpack(old))
    for j = 1, #old do
      sum = sum - (tonumber(counts[j]) or 0)
      if old[j] == hit.gid then hit.held = 0 end -- dropped below
    end
    if sum < 0 then sum = 0 end
    if mode == 0 then
      redis.call('HDEL', h, unpack(old))
      redis.call('ZREMRANGEBYSCORE', z, '-inf', int(edge))
      redis.call('HSET', h, 's', int(sum), 'x', int(math.max(tonumber(fields[5]) or edge, edge)))
    end
    first = redis.call('ZRANGEBYSCORE', z, int(edge + 1), '+inf', 'WITHSCORES', 'LIMIT', '0', '1')
    if mode == 0 and #first == 0 then
      -- Every slot has left: the window is as a fresh one (Memory's ring
      -- is empty), even for a clock read behind later.
      redis.call('HDEL', h, 'n')
      hit.newest = nil
    end
  end
  if #first > 0 then hit.first, hit.oldest = first[1], tonumber(first[2]) end
  if not hit.newest and #first > 0 then
    -- A window written before "n" was kept.
    local last = redis.call('ZRANGE', z, '-1', '-1', 'WITHSCORES')
    hit.newest = tonumber(last[2])
  end
  hit.sum = sum
  -- A settled charge may have taken the sum past the limit; a cost of 0
  -- still reads the state.
  hit.allowed = hit.cost == 0 or sum + hit.cost <= hit.limit
  if hit.allowed then return end
  hit.retry = hit.window
  if hit.cost > hit.limit or not hit.oldest then return end
  -- The wait until enough of the oldest slots leave for cost to fit.
  -- Every live slot holds at least one unit, so the slot that frees
  -- enough is among the first `need`: one, for a request of cost 1, and
  -- that one is read already.
  local need = sum + hit.cost - hit.limit
  if need <= 1 then
    hit.retry = math.max(hit.oldest + hit.window - now, 1)
    return
  end
  local slots = redis.call('ZRANGEBYSCORE', z, int(edge + 1), '+inf', 'WITHSCORES', 'LIMIT', '0', int(math.min(need, maxslots + 1)))
  local ids = {}
  for j = 1, #slots, 2 do ids[#ids + 1] = slots[j] end
  local counts = redis.call('HMGET', h, unpack(ids))
  local freed = 0
  for j = 1, #ids do
    freed = freed + (tonumber(counts[j]) or 0)
    if freed >= need then
      hit.retry = math.max(tonumber(slots[2 * j]) + hit.window - now, 1)
      return
    end
  end
end

-- Count (mode 0) or preview (mode 1) the admission of a window hit.
local function takeWindow(hit)
  -- A clock that went backwards (a failover to a server behind) must not
  -- let an admission leave before the ones already counted.
  local at = now
  if hit.newest and hit.newest > at then at = hit.newest end
  local id, bucket, tie
  if hit.gid then
    bucket, id = hit.group, hit.gid
  elseif hit.newest and now <= hit.newest and hit.oldest then
    tie = true -- joins the newest slot (read below, when recording)
  else
    id = slotid(hit.q + 1)
  end
  hit.sum = hit.sum + hit.cost
  hit.reset = at + hit.window - now
  -- The oldest live slot once counted: the oldest now, unless that is the
  -- grouped slot this admission joins, which moves to `at`.
  local oldest = hit.oldest or at
  if bucket and hit.first == id then
    local two = redis.call('ZRANGEBYSCORE', hit.z, int(hit.edge + 1), '+inf', 'WITHSCORES', 'LIMIT', '0', '2')
    oldest = at
    if #two >= 4 then oldest = math.min(tonumber(two[4]), at) end
  end
  hit.nxt = math.max(oldest + hit.window - now, 0)
  if mode ~= 0 then return end
  -- The keys expire one window after this admission: its slot leaves the
  -- window then, the last of them (a slot leaves with its latest
  -- admission), so nothing is left to keep.
  local ttl = int(math.ceil((at - now + hit.window) / 1000))
  local ats = int(at)
  local made = none
  if not hit.made then made = {'g', ats} end
  if tie then
    id = redis.call('ZRANGE', hit.z, '-1', '-1')[1]
    if string.sub(id, 1, 1) == 'g' then
      hit.rec = -(tonumber(string.sub(id, 2)) + 1) -- grouped under a larger limit before
    else
      hit.rec = tonumber(id)
    end
  end
  redis.call('ZADD', hit.z, ats, id)
  if bucket then
    redis.call('HSET', hit.h, 's', int(hit.sum), 'n', ats, id, int(hit.held + hit.cost), unpack(made))
    hit.rec = -(bucket + 1)
  elseif tie then
    redis.call('HINCRBY', hit.h, id, int(hit.cost))
    redis.call('HSET', hit.h, 's', int(hit.sum), 'n', ats, unpack(made))
  else
    redis.call('HSET', hit.h, 's', int(hit.sum), 'q', int(hit.q + 1), 'n', ats, id, int(hit.cost), unpack(made))
    hit.rec = hit.q + 1
  end
  redis.call('PEXPIRE', hit.z, ttl)
  redis.call('PEXPIRE', hit.h, ttl)
end

-- Reset and next after of a window hit not counted.
local function reportWindow(hit)
  if hit.newest then hit.reset = math.max(hit.newest + hit.window - now, 0) end
  if hit.oldest then hit.nxt = math.max(hit.oldest + hit.window - now, 0) end
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

local function evalBucket(hit)
  local s = redis.call('GET', hit.b)
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
  local full = math.min((hit.burst - tokens) * hit.window / hit.limit, 1e15)
  -- %.17g writes an integer's digits as %d does, far slower.
  local f = '%.17g %d'
  if tokens == math.floor(tokens) and tokens > -1e15 and tokens < 1e15 then f = '%d %d' end
  redis.call('SET', hit.b, fmt(f, tokens, last), 'PX', int(math.ceil(full / 1000) + 1000))
  hit.rec = 1
end

-- A calendar counter: the cost counted since its period began.
local function evalCalendar(hit)
  hit.sum = 0
  local s = redis.call('GET', hit.c)
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
    redis.call('SET', hit.c, v, 'EX', int(hit.expire))
  end
  hit.rec = hit.start
end

local ok = true
local hits = {}
local k = 1
for i = 1, n do
  local a = 6 + (i - 1) * 6
  local hit = {bucket = ARGV[a + 1] == 'b', shadow = ARGV[a + 2] == '1', limit = tonumber(ARGV[a + 3]),
               window = tonumber(ARGV[a + 4]), cost = tonumber(ARGV[a + 5]), burst = tonumber(ARGV[a + 6]),
               allowed = false, retry = 0, reset = 0, nxt = 0, rec = 0}
  if ARGV[a + 1] == 'c' then
    hit.cal, hit.c, hit.start, hit.expire = true, KEYS[k], hit.window, hit.burst
    k = k + 1
    evalCalendar(hit)
  elseif hit.bucket then
    hit.b = KEYS[k]
    k = k + 1
    evalBucket(hit)
  else
    hit.z, hit.h = KEYS[k], KEYS[k + 1]
    k = k + 2
    evalWindow(hit)
  end
  if marks > 0 then
    hit.p = KEYS[k]
    k = k + 1
  end
  if not hit.allowed and not hit.shadow then ok = false end
  hits[i] = hit
end

-- Clamping hits (SPEC §8.2): after the hits, ARGV holds their number,
-- the batch's output asked for and its minimum, then per clamping hit its
-- index, base cost and cost per output token. When one of them has less
-- left than its cost, the output is lowered to the largest that fits on
-- every one (limits/limits.go's Clamp.fits: the same float operations),
-- and each is charged its base plus that output's price, here, in the
-- step that read what remains. Returned after the hits: the output (-1
-- when nothing was lowered), then each clamping hit's cost.
local ca = 6 + n * 6
local nc = tonumber(ARGV[ca + 1]) or 0
local outcap = -1
if nc > 0 and mode ~= 2 then
  local maxo, mino = tonumber(ARGV[ca + 2]), tonumber(ARGV[ca + 3])
  local o = maxo
  local cl = {}
  for j = 1, nc do
    local b = ca + 3 + (j - 1) * 3
    local c = {hit = hits[tonumber(ARGV[b + 1])], base = tonumber(ARGV[b + 2]), per = tonumber(ARGV[b + 3])}
    local hit = c.hit
    local avail
    if hit.bucket then
      avail = 0
      if hit.limit > 0 then avail = math.max(math.floor(hit.level), 0) end
    else
      avail = math.max(hit.limit - hit.sum, 0)
    end
    local q = math.floor((avail - c.base) / c.per)
    local f
    if q >= maxo then
      f = maxo
    elseif q < -1 then
      f = -1
    else
      f = q
      local tries = 0
      while f >= 0 and c.base + math.ceil(f * c.per) > avail do
        if tries == 2 then f = -1 break end
        f = f - 1
        tries = tries + 1
      end
    end
    if f < o then o = f end
    cl[j] = c
  end
  if o < maxo and o >= mino then
    outcap = o
    ok = true
    for j = 1, nc do
      local hit = cl[j].hit
      hit.cost = cl[j].base + math.ceil(o * cl[j].per)
      hit.allowed, hit.retry = true, 0
    end
    for i = 1, n do
      if not hits[i].allowed and not hits[i].shadow then ok = false end
    end
  end
end

local out = {ok and 1 or 0, now}
for i = 1, n do
  local hit = hits[i]
  local take = ok and mode ~= 2 and hit.allowed and hit.cost > 0
  if hit.cal then
    if take and mode == 0 then takeCalendar(hit) end
  elseif hit.bucket then
    if take and mode == 0 then takeBucket(hit) end
  elseif take then
    takeWindow(hit)
  else
    reportWindow(hit)
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
  if hit.cal then
    out[#out + 1] = hit.sum
    out[#out + 1] = hit.made or 0
    out[#out + 1] = 0
    out[#out + 1] = 0
  elseif hit.bucket then
    out[#out + 1] = hit.state
    out[#out + 1] = 0
    out[#out + 1] = 0
    out[#out + 1] = 0
  else
    out[#out + 1] = math.max(hit.limit - hit.sum, 0)
    out[#out + 1] = hit.retry
    out[#out + 1] = hit.reset
    out[#out + 1] = hit.nxt
  end
end
out[#out + 1] = outcap
for j = 1, nc do
  out[#out + 1] = hits[tonumber(ARGV[ca + 3 + (j - 1) * 3 + 1])].cost
end
return out
