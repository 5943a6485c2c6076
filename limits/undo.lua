-- Roll back admissions that redis.lua recorded (ratelimit-proxy): on a
-- Redis Cluster a batch whose counters live in different slots is decided
-- one slot at a time, and when a later part refuses, the parts already
-- recorded are taken back with this script.
--
-- KEYS, per admission in order: a sliding window's sorted set and hash,
-- or a token bucket's key. ARGV: [1] number of admissions, then per
-- admission: algorithm ("w": sliding window, "b": token bucket), what
-- redis.lua recorded (a window's slot: > 0 a sequence number, < 0
-- -(bucket+1) a grouped slot; 1 for a bucket), the cost to take back and
-- the burst (buckets only). Returns the number rolled back.
local n = tonumber(ARGV[1])
local done = 0
local k = 1
for i = 1, n do
  local a = 1 + (i - 1) * 4
  local alg, slot, cost, burst = ARGV[a + 1], tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  if alg == 'b' then
    -- Give the tokens back, never above burst; the bucket keeps its time
    -- and its expiry. A bucket that expired has nothing to give back to.
    local b = KEYS[k]
    k = k + 1
    local s = redis.call('GET', b)
    local tokens, last
    if s then tokens, last = string.match(s, '^(%S+) (%S+)$') end
    if tonumber(tokens) ~= nil and last ~= nil then
      tokens = tonumber(tokens) + cost
      if tokens > burst then tokens = burst end
      local v = string.format('%.17g', tokens) .. ' ' .. last
      local ttl = redis.call('PTTL', b)
      if ttl > 0 then
        redis.call('SET', b, v, 'PX', ttl)
      else
        redis.call('SET', b, v)
      end
      done = done + 1
    end
  else
    local z, h = KEYS[k], KEYS[k + 1]
    k = k + 2
    local id
    if slot > 0 then id = tostring(slot) else id = 'g' .. tostring(-slot - 1) end
    -- A slot that has left the window (or a key that expired) has nothing
    -- left to take back.
    if redis.call('HEXISTS', h, id) == 1 then
      local left = redis.call('HINCRBY', h, id, -cost)
      if left <= 0 then
        redis.call('HDEL', h, id)
        redis.call('ZREM', z, id)
      end
      local sum = redis.call('HINCRBY', h, 's', -cost)
      if sum < 0 then redis.call('HSET', h, 's', 0) end
      done = done + 1
    end
  end
end
return done
