-- Shared samples (ratelimit-proxy): each name's last values, appended by
-- every instance and read back whole. One slot: KEYS[1] is the set of
-- names, and each name's list is KEYS[1] .. ':' .. name (the same hash
-- tag, so the same slot on a Cluster).
--
-- ARGV: [1] window (values kept per name), [2] how long an untouched
-- sample lives, ms, [3] most names, then per name: the name, how many
-- values, the values (oldest first). A name past the most is dropped.
-- Returns name, values (oldest first), name, values, … for every name.
local set = KEYS[1]
local window, ttl, most = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
local i = 4
while i <= #ARGV do
  local name, n = ARGV[i], tonumber(ARGV[i + 1])
  if redis.call('SISMEMBER', set, name) == 1 or redis.call('SCARD', set) < most then
    local k = set .. ':' .. name
    redis.call('SADD', set, name)
    redis.call('RPUSH', k, unpack(ARGV, i + 2, i + 1 + n))
    redis.call('LTRIM', k, -window, -1)
    redis.call('PEXPIRE', k, ttl)
  end
  i = i + 2 + n
end
if i > 4 then
  redis.call('PEXPIRE', set, ttl)
end
local out = {}
for _, name in ipairs(redis.call('SMEMBERS', set)) do
  local values = redis.call('LRANGE', set .. ':' .. name, 0, -1)
  if #values == 0 then
    redis.call('SREM', set, name) -- its list expired
  else
    out[#out + 1] = name
    out[#out + 1] = values
  end
end
return out
