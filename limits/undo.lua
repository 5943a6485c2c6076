-- Roll back admissions that redis.lua recorded (ratelimit-proxy): on a
-- Redis Cluster a batch whose counters live in different slots is decided
-- one slot at a time, and when a later part refuses, the parts already
-- admitted are taken back with this script.
--
-- KEYS: for admission i, KEYS[2i-1] and KEYS[2i] are the hit's sorted set
-- and hash. ARGV: [1] number of admissions, then per admission: the slot
-- redis.lua returned (> 0: a sequence number; < 0: -(bucket+1), a grouped
-- slot) and the cost to take back. Returns the number rolled back.
local n = tonumber(ARGV[1])
local done = 0
for i = 1, n do
  local z, h = KEYS[2 * i - 1], KEYS[2 * i]
  local slot, cost = tonumber(ARGV[2 * i]), tonumber(ARGV[2 * i + 1])
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
return done
