-- Correct charges that redis.lua recorded (ratelimit-proxy): settle a
-- reservation to what it really cost, giving the difference back or
-- charging the extra, and roll back the admissions of a split batch on a
-- Redis Cluster (a refund of the whole cost). See redis.lua for the keys.
--
-- ARGV: [1] number of corrections, [2] now in µs (0: Redis's TIME), [3]
-- maxSlots; then per correction: algorithm ("w": sliding window, "b":
-- token bucket, "c": calendar), what redis.lua recorded (a window's slot:
-- > 0 a sequence number, < 0 -(bucket+1) a grouped slot; 1 for a bucket;
-- a calendar counter's period start, unix s), when a window admission was
-- counted (µs; 0 for a rollback: not checked; a calendar counter: when
-- its counter was made, µs, 0 for a rollback), the
-- correction (< 0: give back that many units, > 0: charge that many at
-- now), limit, window (µs), burst. KEYS, per correction in order: a
-- sliding window's sorted set and hash, a token bucket's key or a
-- calendar counter's key. Returns the number of corrections made.
--
-- A calendar counter is corrected, either way, only while it still counts
-- the period the admission was counted in and that period is the current
-- one: a settlement never lands in the next period.
--
-- A refund is taken from the slot the admission was counted in, never
-- more than it holds, while the admission is in the window and its
-- counter is the one it was counted in (one made after it, "g", follows a
-- Reset); a slot left empty is dropped. A bucket gets its tokens back at
-- its stored time, never above burst; one that expired has nothing to
-- give back to. An extra charge is counted at now without a decision, as
-- redis.lua would count an admission (and as limits/window.go and
-- limits/bucket.go do): it may take the sum past the limit, the bucket
-- below 0.
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local maxslots = tonumber(ARGV[3])

local function refundWindow(z, h, rec, at, units, window)
  if at > 0 then
    if at + window <= now then return 0 end -- left the window
    local f = redis.call('HMGET', h, 'g', 'x')
    local made, gone = tonumber(f[1]), tonumber(f[2])
    if made and made > at then return 0 end -- another counter
    -- Slots counted then were dropped (at a clock read later than now):
    -- as limits/window.go, which cannot tell its slots apart, does not
    -- give back.
    if gone and gone >= at then return 0 end
  end
  local id
  if rec > 0 then id = tostring(rec) else id = 'g' .. tostring(-rec - 1) end
  local held = tonumber(redis.call('HGET', h, id))
  if not held or held <= 0 then return 0 end
  if units > held then units = held end
  if units == held then
    redis.call('HDEL', h, id)
    redis.call('ZREM', z, id)
    -- "n" follows the newest slot left, as Memory's ring does.
    local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
    if #last > 0 then
      redis.call('HSET', h, 'n', last[2])
    else
      redis.call('HDEL', h, 'n')
    end
  else
    redis.call('HINCRBY', h, id, -units)
  end
  local sum = redis.call('HINCRBY', h, 's', -units)
  if sum < 0 then redis.call('HSET', h, 's', 0) end
  return 1
end

-- Count units at now in a window, as redis.lua counts an admission
-- (evalWindow and takeWindow in mode 0): in a slot of its own, the newest
-- one when counted at its time or when the live slots reach the limit
-- (limits/window.go's place), or the grouped slot of now's 1/maxSlots of
-- the window past maxSlots.
local function chargeWindow(z, h, units, limit, window)
  local f = redis.call('HMGET', h, 's', 'q', 'n', 'g', 'x')
  local sum, q = tonumber(f[1]) or 0, tonumber(f[2]) or 0
  local newest = tonumber(f[3])
  -- First forget the slots that have left the window, as a decision does.
  local edge = now - window
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', edge)
  if #old > 0 then
    local counts = redis.call('HMGET', h, unpack(old))
    for j = 1, #old do sum = sum - (tonumber(counts[j]) or 0) end
    if sum < 0 then sum = 0 end
    redis.call('HDEL', h, unpack(old))
    redis.call('ZREMRANGEBYSCORE', z, '-inf', edge)
    redis.call('HSET', h, 'x', math.max(tonumber(f[5]) or edge, edge))
  end
  local live = redis.call('ZCARD', z)
  if live == 0 then
    newest = nil -- nothing counted: as a fresh window
  elseif not newest then
    newest = tonumber(redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')[2])
  end
  local at = now
  if newest and newest > at then at = newest end
  local id
  if limit > maxslots then
    id = 'g' .. tostring(math.floor(now / math.max(math.floor(window / maxslots), 1)))
  elseif live > 0 and newest and (now <= newest or live >= math.max(limit, 1)) then
    id = redis.call('ZRANGE', z, -1, -1)[1]
  end
  local fields = {'s', sum + units, 'n', at}
  if not id then
    q = q + 1
    id = tostring(q)
    fields[#fields + 1] = 'q'
    fields[#fields + 1] = q
  end
  if not f[4] then
    fields[#fields + 1] = 'g'
    fields[#fields + 1] = at
  end
  redis.call('ZADD', z, at, id)
  redis.call('HINCRBY', h, id, units)
  redis.call('HSET', h, unpack(fields))
  -- The keys expire one window after this charge, as takeWindow does.
  local ttl = math.ceil((at - now + window) / 1000)
  redis.call('PEXPIRE', z, ttl)
  redis.call('PEXPIRE', h, ttl)
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
    local z, h = KEYS[k], KEYS[k + 1]
    k = k + 2
    if delta < 0 then
      done = done + refundWindow(z, h, rec, at, -delta, window)
    elseif delta > 0 then
      chargeWindow(z, h, delta, limit, window)
      done = done + 1
    end
  end
end
return done
