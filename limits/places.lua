-- Take, read or renew the places of concurrency rules (ratelimit-proxy),
-- on Redis's clock. A (rule, key)'s places are one sorted set: member a
-- lease id (an instance's id and a sequence), score the lease's expiry in
-- ms. A lease not renewed by its instance expires: a dead instance's
-- places come back within the lease's time.
--
-- ARGV[1] mode: "take" (all-or-nothing, as below), "read" (the counts
-- only), "renew" (every member given in ARGV[4..] of KEYS[1] that is
-- still there gets a new expiry: ZADD XX); ARGV[2] the lease's time, ms;
-- ARGV[3] how long a set lives after its last write, ms.
-- take/read: then per key (KEYS[i]) four values: limit, cost (0 reads,
-- 1 takes a place), shadow (1: never vetoes the batch), member.
-- Returns, for take/read: allowed (1/0: every enforcing hit has a place),
-- then per key the places in use before this call. With take and allowed,
-- each hit of cost 1 whose key has a free place (a shadow hit only when it
-- fits) holds one more, under its member.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local mode, lease, life = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])

if mode == 'renew' then
  local n = 0
  for i = 4, #ARGV do
    n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', now + lease, ARGV[i])
  end
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('PEXPIRE', KEYS[1], life)
  end
  return n
end

local out = {0}
local allowed = 1
local fits = {}
for i = 1, #KEYS do
  local a = 3 + (i - 1) * 4
  local limit, cost, shadow = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), ARGV[a + 3] == '1'
  redis.call('ZREMRANGEBYSCORE', KEYS[i], '-inf', now)
  local n = redis.call('ZCARD', KEYS[i])
  out[i + 1] = n
  fits[i] = cost == 0 or n < limit
  if not shadow and not fits[i] then
    allowed = 0
  end
end
out[1] = allowed
if allowed == 1 and mode == 'take' then
  for i = 1, #KEYS do
    local a = 3 + (i - 1) * 4
    if fits[i] and tonumber(ARGV[a + 2]) > 0 then
      redis.call('ZADD', KEYS[i], now + lease, ARGV[a + 4])
      redis.call('PEXPIRE', KEYS[i], life)
    end
  end
end
return out
