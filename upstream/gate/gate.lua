-- One step of an upstream group's gate (SPEC §9), atomic on Redis.
--
-- KEYS (one hash tag: one slot on a Cluster)
--   1 f  in-flight leases: zset id → expiry ms
--   2 q  the queue: zset id → priority × 2^49 + place (below)
--   3 l  the queue's liveness: zset id → expiry ms
--   4 r  the outbound rate's sends: zset member → send ms
--   5 s  hash: p (pause until ms), fa mk hd ld (adaptive factor ppm, clean
--        period start, hold end, last decrease), cf (the group's limits:
--        ARGV 3..7 and 9..14 as the instance that loaded them last sent
--        them, space-separated)
--   6 v  fair share's hash (fair_by; below): v<prio>, f<prio>:<key>,
--        c<prio>:<key>, w<id>
-- ARGV
--   1 op: enter | grant | leave | release | throttle | resend | renew | drop | conf
--   2 now in ms, or "" for Redis's clock
--   3 max in flight (0 none)   4 rate (0 none)   5 per ms
--   6 queue bound              7 max wait ms     8 lease ms
--   9..14 adaptive: start increase every decrease hold ceiling (start 0: off)
--   15 channel to publish a freed slot on
--   16.. the op's own
-- The limits (3..7, 9..14) are this instance's; those stored in cf, the
-- ones loaded last on any instance, take their place (conf stores them).
-- Every reply ends with the factor (ppm) and the pause remaining (ms).
--
-- The queue's score is priority × 2^49 plus a place within the priority
-- (2^49 ms is 17,000 years: places never reach the next priority, and
-- every score is an exact double). Without fair share the place is the
-- arrival time, ms. With it (fair_by: enter names the waiter's fair key
-- and weight) the place is a virtual time, start-time fair queueing: a
-- key with nothing queued starts at the priority's virtual time v (the
-- place of the waiter granted last), each further waiter of that key
-- 1000/weight after the key's previous one (f: where its next starts).
-- So a newcomer is served before every backlogged key's next waiter
-- (behind at most one turn), a lone key is served as fast as slots free
-- (the order only ranks waiters), and weights 3:1 interleave 3:1. v
-- starts at the time, ms, so the first fair waiters queue behind those
-- that came before fair share was turned on. Each queued waiter's key is
-- kept (w<id>) and counted (c), so that a key whose waiters all left
-- starts afresh at v, not behind its own abandoned places; the hash
-- holds only keys with waiters.

local f, q, l, r, s, v = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local PRIO = 562949953421312 -- 2^49
local op = ARGV[1]
local now = tonumber(ARGV[2])
if not now then
	local t = redis.call('TIME')
	now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local lease, channel = tonumber(ARGV[8]), ARGV[15]
local st = redis.call('HMGET', s, 'p', 'fa', 'mk', 'hd', 'ld', 'cf')
local mine = table.concat({ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7],
	ARGV[9], ARGV[10], ARGV[11], ARGV[12], ARGV[13], ARGV[14]}, ' ')
local cf = st[6]
if op == 'conf' or (not cf and op == 'renew') then
	cf = mine
	redis.call('HSET', s, 'cf', cf)
elseif not cf then
	cf = mine
end
local lim = {}
for v in string.gmatch(cf, '%S+') do
	lim[#lim + 1] = tonumber(v)
end
local cap, rate, per, qcap, maxwait = lim[1], lim[2], lim[3], lim[4], lim[5]
local a_start, a_inc, a_every, a_dec, a_hold, a_ceil = lim[6], lim[7], lim[8], lim[9], lim[10], lim[11]
local INF = 1e18
-- The pause, the adaptive state and the limits outlive any hold and
-- clean period, and every renewal keeps them.
local STATE_TTL = math.max(86400000, 2 * (a_hold + a_every))
if op == 'conf' or op == 'renew' then
	redis.call('PEXPIRE', s, STATE_TTL)
end

-- A waiter out of the queue (granted, gone, dead) leaves its fair key's
-- count; a key without waiters leaves the hash. Granted, its place
-- becomes its priority's virtual time.
local function unfair(id, place)
	local wk = 'w' .. id
	local pk = redis.call('HGET', v, wk)
	if not pk then
		return
	end
	redis.call('HDEL', v, wk)
	if place then
		local prio = tonumber(string.match(pk, '^(%d+):'))
		local vk = 'v' .. prio
		local at = place - prio * PRIO
		if at > (tonumber(redis.call('HGET', v, vk)) or -1) then
			redis.call('HSET', v, vk, at)
		end
	end
	if redis.call('HINCRBY', v, 'c' .. pk, -1) <= 0 then
		redis.call('HDEL', v, 'c' .. pk, 'f' .. pk)
	end
end

-- Before a decision: expired leases and waiters of dead instances go,
-- and sends that have left the rate's window.
if op == 'enter' or op == 'grant' then
	redis.call('ZREMRANGEBYSCORE', f, '-inf', now)
	local dead = redis.call('ZRANGEBYSCORE', l, '-inf', now, 'LIMIT', 0, 1000)
	if #dead > 0 then
		redis.call('ZREM', q, unpack(dead))
		redis.call('ZREM', l, unpack(dead))
		for _, id in ipairs(dead) do
			unfair(id, nil)
		end
	end
	if rate > 0 then
		redis.call('ZREMRANGEBYSCORE', r, '-inf', now - per)
	end
end

local pause = tonumber(st[1]) or 0
local fa, mk, hd, ld = tonumber(st[2]), tonumber(st[3]), tonumber(st[4]) or 0, tonumber(st[5]) or 0

-- The adaptive factor, advanced lazily: after the hold, each whole period
-- without a 429 adds the increase, up to the ceiling.
local function factor()
	if a_start == 0 then
		return 1000000
	end
	if not fa then
		fa, mk = math.min(a_start, a_ceil), now
		redis.call('HSET', s, 'fa', fa, 'mk', mk)
		redis.call('PEXPIRE', s, STATE_TTL)
		return fa
	end
	if now >= hd then
		local base = math.max(mk, hd)
		if now - base >= a_every then
			local steps = math.floor((now - base) / a_every)
			fa = math.min(a_ceil, fa + steps * a_inc)
			mk = base + steps * a_every
			redis.call('HSET', s, 'fa', fa, 'mk', mk)
			redis.call('PEXPIRE', s, STATE_TTL)
		end
	end
	return math.min(fa, a_ceil)
end

local function left()
	return math.max(pause - now, 0)
end

-- Free slots, free sends, and the ms at which the next send frees.
local function room()
	local free, rfree, nxt = INF, INF, 0
	if cap > 0 then
		free = cap - redis.call('ZCARD', f)
	end
	if rate > 0 then
		local limit = rate
		if a_start > 0 then
			limit = math.max(1, math.floor(rate * factor() / 1000000))
		end
		local n = redis.call('ZCARD', r)
		rfree = limit - n
		if rfree <= 0 then
			local e = redis.call('ZRANGE', r, n - limit, n - limit, 'WITHSCORES')
			nxt = tonumber(e[2]) + per
		end
	end
	return free, rfree, nxt
end

local function take(id)
	redis.call('ZADD', f, now + lease, id)
	redis.call('PEXPIRE', f, lease * 2)
	if rate > 0 then
		redis.call('ZADD', r, now, id)
		redis.call('PEXPIRE', r, per + 1000)
	end
end

-- The score a waiter of priority prio would queue at: with a fair key
-- (fk not false), its place in turns and the key's field name.
local function place(prio, fk, weight)
	if not fk then
		return prio * PRIO + now
	end
	local pk = prio .. ':' .. fk
	local vt = tonumber(redis.call('HGET', v, 'v' .. prio))
	if not vt then
		vt = now
		redis.call('HSET', v, 'v' .. prio, vt)
		redis.call('PEXPIRE', v, lease * 2)
	end
	local start = vt
	if redis.call('HEXISTS', v, 'c' .. pk) == 1 then
		start = math.max(vt, tonumber(redis.call('HGET', v, 'f' .. pk)) or vt)
	end
	return prio * PRIO + start, pk, start + 1000 / weight
end

local function enqueue(id, score, pk, nextf)
	redis.call('ZADD', q, score, id)
	redis.call('ZADD', l, now + lease, id)
	redis.call('PEXPIRE', q, lease * 2)
	redis.call('PEXPIRE', l, lease * 2)
	if pk then
		redis.call('HSET', v, 'w' .. id, pk, 'f' .. pk, nextf)
		redis.call('HINCRBY', v, 'c' .. pk, 1)
		redis.call('PEXPIRE', v, lease * 2)
	end
end

if op == 'enter' then
	-- ARGV 16 id, 17 priority, with fair share 18 the fair key and 19
	-- its weight. Reply: outcome (0 granted, 1 queued, 2 queue full,
	-- 3 paused past max wait), hint ms.
	local id, prio = ARGV[16], tonumber(ARGV[17])
	local fk, weight = ARGV[18] or false, tonumber(ARGV[19]) or 1
	if pause > now then
		if pause - now > maxwait then
			return {3, pause - now, factor(), left()}
		end
		if redis.call('ZCARD', q) >= qcap then
			return {2, pause - now, factor(), left()}
		end
		enqueue(id, place(prio, fk, weight))
		return {1, pause - now, factor(), left()}
	end
	local free, rfree, nxt = room()
	local score, pk, nextf = place(prio, fk, weight)
	local ahead = redis.call('ZCOUNT', q, '-inf', score)
	if ahead < math.min(free, rfree) then
		take(id)
		return {0, 0, factor(), 0}
	end
	local hint = 0
	if rfree <= 0 then
		hint = nxt - now
	end
	if redis.call('ZCARD', q) >= qcap then
		return {2, hint, factor(), 0}
	end
	enqueue(id, score, pk, nextf)
	return {1, hint, factor(), 0}
elseif op == 'grant' then
	-- ARGV 16 this instance's id prefix. The waiters at the head of the
	-- queue get the free slots; those of this instance are granted here,
	-- the others by their own instance. Reply: ids granted, hint ms.
	local prefix = ARGV[16]
	if pause > now then
		return {{}, pause - now, factor(), left()}
	end
	local free, rfree, nxt = room()
	local n = math.min(free, rfree, 1000)
	local got = {}
	if n > 0 then
		local heads = redis.call('ZRANGE', q, 0, n - 1, 'WITHSCORES')
		for i = 1, #heads, 2 do
			local id = heads[i]
			if string.sub(id, 1, #prefix) == prefix then
				redis.call('ZREM', q, id)
				redis.call('ZREM', l, id)
				unfair(id, tonumber(heads[i + 1]))
				take(id)
				got[#got + 1] = id
			end
		end
		free, rfree, nxt = room()
	end
	local hint = 0
	if rfree <= 0 then
		hint = nxt - now
	end
	return {got, hint, factor(), 0}
elseif op == 'leave' then
	-- ARGV 16 id. Reply: 1 left the queue, 2 holds a slot (granted
	-- meanwhile), 0 neither (expired).
	local id = ARGV[16]
	if redis.call('ZREM', q, id) == 1 then
		redis.call('ZREM', l, id)
		unfair(id, nil)
		return {1, 0, factor(), left()}
	end
	if redis.call('ZSCORE', f, id) then
		return {2, 0, factor(), left()}
	end
	return {0, 0, factor(), left()}
elseif op == 'release' then
	-- ARGV 16 id. Waiters anywhere hear of the freed slot.
	if redis.call('ZREM', f, ARGV[16]) == 1 and redis.call('ZCARD', q) > 0 then
		redis.call('PUBLISH', channel, '1')
	end
	return {0, 0, factor(), left()}
elseif op == 'throttle' then
	-- ARGV 16 pause ms, 17 age of the throttled request ms, 18 "1" for a
	-- 429 (lowers the adaptive factor once per round).
	local untl = now + tonumber(ARGV[16])
	if untl > pause then
		pause = untl
		redis.call('HSET', s, 'p', pause)
		redis.call('PEXPIRE', s, STATE_TTL)
	end
	local fac = factor()
	if ARGV[18] == '1' and a_start > 0 and now - tonumber(ARGV[17]) >= ld then
		local floor = math.min(math.ceil(1000000 / rate), a_ceil)
		fa = math.min(fac, math.max(floor, math.floor(fac * a_dec / 1000000)))
		hd = now + a_hold
		redis.call('HSET', s, 'fa', fa, 'mk', hd, 'hd', hd, 'ld', now)
		redis.call('PEXPIRE', s, STATE_TTL)
		fac = fa
	end
	return {0, 0, fac, left()}
elseif op == 'resend' then
	-- ARGV 16 member. A retry (which holds its slot) leaves when no pause
	-- holds the group and the rate has room; the send is then counted.
	-- Reply: 0 to go, else the ms to wait.
	if pause > now then
		return {0, pause - now, factor(), left()}
	end
	if rate > 0 then
		redis.call('ZREMRANGEBYSCORE', r, '-inf', now - per)
		local _, rfree, nxt = room()
		if rfree <= 0 then
			return {0, math.max(nxt - now, 1), factor(), 0}
		end
		redis.call('ZADD', r, now, ARGV[16])
		redis.call('PEXPIRE', r, per + 1000)
	end
	return {0, 0, factor(), 0}
elseif op == 'drop' then
	-- ARGV 16 id: whatever a failed step left for it (a place, a slot).
	local id = ARGV[16]
	if redis.call('ZREM', q, id) == 1 then
		unfair(id, nil)
	end
	redis.call('ZREM', l, id)
	if redis.call('ZREM', f, id) == 1 and redis.call('ZCARD', q) > 0 then
		redis.call('PUBLISH', channel, '1')
	end
	return {0, 0, factor(), left()}
elseif op == 'conf' then
	-- The limits are stored (above); a raised one is room for waiters
	-- anywhere: they hear of it as of a freed slot.
	if redis.call('ZCARD', q) > 0 then
		redis.call('PUBLISH', channel, '1')
	end
	-- The factor as it is, not started: its first period begins with
	-- the group's first request, as in memory.
	local fac = 1000000
	if a_start > 0 then
		fac = fa and factor() or math.min(a_start, a_ceil)
	end
	return {0, 0, fac, left()}
elseif op == 'renew' then
	-- ARGV 16.. ids this instance still holds or keeps waiting.
	for i = 16, #ARGV do
		redis.call('ZADD', f, 'XX', now + lease, ARGV[i])
		redis.call('ZADD', l, 'XX', now + lease, ARGV[i])
	end
	if #ARGV >= 16 then
		redis.call('PEXPIRE', f, lease * 2)
		redis.call('PEXPIRE', q, lease * 2)
		redis.call('PEXPIRE', l, lease * 2)
		redis.call('PEXPIRE', v, lease * 2)
	end
	return {0, 0, factor(), left()}
end
return redis.error_reply('gate: unknown op ' .. tostring(op))
