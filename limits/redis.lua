-- Decide a batch of sliding-window hits atomically (ratelimit-proxy).
--
-- KEYS: for hit i, KEYS[2i-1] is a sorted set of time slots (member: slot
-- id, score: the slot's latest admission, µs) and KEYS[2i] a hash (slot id
-- -> cost counted in it; "s": the sum of live slots; "q": a sequence).
-- ARGV: [1] number of hits, [2] now in µs (0: Redis's TIME), then per hit:
-- limit, window (µs), cost, maxSlots.
-- A limit up to maxSlots gives every admission its own slot (exact); a
-- larger one groups admissions in 1/maxSlots of the window, each group
-- leaving the window with its latest admission (never admits more).
-- Returns: allowed (1/0), then per hit: allowed, remaining, retry after,
-- reset after, next after (µs), and the slot the admission went into (a
-- sequence number > 0, or -(bucket+1) for a grouped slot; 0 when nothing
-- was recorded), which undo.lua takes to roll the admission back.
--
-- Work is bounded by what the hit needs, never by the window's contents:
-- a refusal reads the oldest slots that must leave for the cost to fit
-- (one, for a request of cost 1) and the newest, so the over-limit
-- caller's hot path costs Redis no more than an admission.
local n = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local ok = true
local hits = {}
for i = 1, n do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  local a = 2 + (i - 1) * 4
  local hit = {z = z, h = h, limit = tonumber(ARGV[a + 1]), window = tonumber(ARGV[a + 2]),
               cost = tonumber(ARGV[a + 3]), slots = tonumber(ARGV[a + 4])}
  -- Forget the slots that have left the window (now - window, now].
  local edge = now - hit.window
  local old = redis.call('ZRANGEBYSCORE', z, '-inf', edge)
  local sum = tonumber(redis.call('HGET', h, 's') or '0')
  if #old > 0 then
    local counts = redis.call('HMGET', h, unpack(old))
    for j = 1, #old do sum = sum - (tonumber(counts[j]) or 0) end
    if sum < 0 then sum = 0 end
    redis.call('HDEL', h, unpack(old))
    redis.call('ZREMRANGEBYSCORE', z, '-inf', edge)
    redis.call('HSET', h, 's', sum)
  end
  hit.sum = sum
  hit.allowed = sum + hit.cost <= hit.limit
  hit.retry = 0
  if not hit.allowed then
    ok = false
    hit.retry = hit.window
    if hit.cost <= hit.limit then
      -- The wait until enough of the oldest slots leave for cost to fit.
      -- Every live slot holds at least one unit, so the slot that frees
      -- enough is among the first `need`: read only those.
      local need = sum + hit.cost - hit.limit
      local slots = redis.call('ZRANGE', z, 0, math.min(need, hit.slots + 1) - 1, 'WITHSCORES')
      if #slots > 0 then
        hit.oldest = tonumber(slots[2])
        local ids = {}
        for j = 1, #slots, 2 do ids[#ids + 1] = slots[j] end
        local counts = redis.call('HMGET', h, unpack(ids))
        local freed = 0
        for j = 1, #ids do
          freed = freed + (tonumber(counts[j]) or 0)
          if freed >= need then
            hit.retry = math.max(tonumber(slots[2 * j]) + hit.window - now, 1)
            break
          end
        end
      end
    end
  end
  hits[i] = hit
end

local out = {ok and 1 or 0}
for i = 1, n do
  local hit = hits[i]
  local reset, nxt, slot = 0, 0, 0
  if ok and hit.cost > 0 then
    -- A clock that went backwards (a failover to a server behind) must not
    -- let an admission leave before the ones already counted.
    local at = now
    local last = redis.call('ZRANGE', hit.z, -1, -1, 'WITHSCORES')
    if #last > 0 and tonumber(last[2]) > at then at = tonumber(last[2]) end
    local id
    if hit.limit <= hit.slots then
      slot = redis.call('HINCRBY', hit.h, 'q', 1)
      id = tostring(slot)
    else
      local bucket = math.floor(now / math.max(math.floor(hit.window / hit.slots), 1))
      slot = -(bucket + 1)
      id = 'g' .. tostring(bucket)
    end
    redis.call('ZADD', hit.z, at, id)
    redis.call('HINCRBY', hit.h, id, hit.cost)
    hit.sum = hit.sum + hit.cost
    redis.call('HSET', hit.h, 's', hit.sum)
    local ttl = math.ceil(hit.window / 1000) + 1000
    redis.call('PEXPIRE', hit.z, ttl)
    redis.call('PEXPIRE', hit.h, ttl)
    reset = at + hit.window - now
    local oldest = redis.call('ZRANGE', hit.z, 0, 0, 'WITHSCORES')
    nxt = math.max(tonumber(oldest[2]) + hit.window - now, 0)
  else
    local newest = redis.call('ZRANGE', hit.z, -1, -1, 'WITHSCORES')
    if #newest > 0 then reset = math.max(tonumber(newest[2]) + hit.window - now, 0) end
    if hit.oldest == nil and #newest > 0 then
      local oldest = redis.call('ZRANGE', hit.z, 0, 0, 'WITHSCORES')
      hit.oldest = tonumber(oldest[2])
    end
    if hit.oldest ~= nil then nxt = math.max(hit.oldest + hit.window - now, 0) end
  end
  out[#out + 1] = (hit.allowed and 1 or 0)
  out[#out + 1] = math.max(hit.limit - hit.sum, 0)
  out[#out + 1] = hit.retry
  out[#out + 1] = reset
  out[#out + 1] = nxt
  out[#out + 1] = slot
end
return out
