-- Shared by every script: prepended to each at build time, followed by a
-- line that names the script's ARGV (its "--: args" line) as locals.
--
-- Times are milliseconds of Redis's clock written with string.format('%d'):
-- tostring() of a Lua number goes through '%.14g', glibc's float printer, a
-- measurable part of a script's time in Redis (bench/RESULTS.md).  Numbers
-- from ARGV stay strings for the same reason.  '%d' is a C long: Redis must
-- be a 64-bit build (docs/redis.md).

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ms(n)
    return string.format('%d', n)
end

-- The record is a live claim held by this attempt's owner token: only then
-- may a closing script (complete, release, fail) or a renewal touch it.
local function owned(state, owner, token)
    return state == 'in_progress' and owner == token
end

-- Somebody waits for this record (idempotency_wait): tell them it changed.
local function announce(key, waiters)
    if waiters then
        redis.call('PUBLISH', 'idem:done', key)
    end
end

local function corrupt(what)
    return redis.error_reply('IDEMCORRUPT record has an unknown ' .. what)
end
local owner, lease = ARGV[1], ARGV[2]
-- Extend the lease of a claim while its request is alive.
--
--: args owner lease
--
-- KEYS[1]  record key
-- owner    owner token
-- lease    lease in milliseconds
--
-- Reply: 1 when extended, 0 when the claim was not ours any more.

local r = redis.call('HMGET', KEYS[1], 'state', 'owner')

if not owned(r[1], r[2], owner) then
    return 0
end

redis.call('HSET', KEYS[1], 'lease', ms(now_ms() + tonumber(lease)))

return 1
