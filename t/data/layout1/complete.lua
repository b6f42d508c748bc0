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
local owner, status, hdr, body, stored, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
-- Record the upstream's final response, if this attempt still owns the claim.
--
--: args owner status hdr body stored ttl
--
-- KEYS[1]  record key
-- owner    owner token
-- status   the upstream's final status
-- hdr      stored headers (netstrings)
-- body     body ("" when not stored)
-- stored   "1" when the body is stored, "0" when it was too large
-- ttl      retention TTL in seconds
--
-- Reply: 1 when recorded, 0 when the claim was lost (lease lapsed, resolved).

local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'waiters')

if not owned(r[1], r[2], owner) then
    return 0
end

announce(KEYS[1], r[3])

redis.call('HSET', KEYS[1],
           'state', 'completed', 'status', status, 'hdr', hdr,
           'body', body, 'stored', stored, 'completed', ms(now_ms()))
redis.call('HDEL', KEYS[1], 'owner', 'lease')
redis.call('EXPIRE', KEYS[1], ttl)

return 1
