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
local fp, owner, op, lease, ttl, wait = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
-- Claim (scope, key) for one attempt, or report what already holds it.
-- One script, so the check and the claim are a single atomic step.
--
--: args fp owner op lease ttl wait
--
-- KEYS[1]  record key
-- fp       request fingerprint (64 hex)
-- owner    owner token (fences complete/release/fail)
-- op       operation id for a new record
-- lease    lease in milliseconds
-- ttl      retention TTL in seconds
-- wait     "1" when the caller waits for an in-flight attempt to finish
--
-- Replies (all strings):
--   {"claimed", op}
--   {"completed", op, status, headers, body, stored}
--   {"mismatch", op, state}
--   {"in_progress", op, lease_left_ms}
--   {"unknown", op}

local now = now_ms()

-- one read for every answer: a replay needs no second call for its response
local r = redis.call('HMGET', KEYS[1], 'v', 'state', 'fp', 'op', 'lease',
                     'status', 'hdr', 'body', 'stored')

if not r[2] and redis.call('EXISTS', KEYS[1]) == 1 then
    -- another application's hash under our name: never write into it
    return corrupt('layout')
end

if not r[2] then
    redis.call('HSET', KEYS[1],
               'v', '1', 'state', 'in_progress', 'fp', fp,
               'owner', owner, 'op', op,
               'lease', ms(now + tonumber(lease)), 'created', ms(now))
    redis.call('EXPIRE', KEYS[1], ttl)
    return {'claimed', op}
end

if r[1] ~= '1' or not r[3] or not r[4] then
    return corrupt('layout')
end

if r[3] ~= fp then
    return {'mismatch', r[4], r[2]}
end

if r[2] == 'completed' then
    return {'completed', r[4], r[6] or '', r[7] or '', r[8] or '', r[9] or '0'}
end

if r[2] == 'in_progress' then
    local left = tonumber(r[5] or '0') - now
    if left > 0 then
        if wait == '1' then
            -- whoever closes this record announces it (idempotency_wait)
            redis.call('HSET', KEYS[1], 'waiters', '1')
        end
        return {'in_progress', r[4], ms(left)}
    end
    -- The owner stopped renewing its lease: it may or may not have reached
    -- the upstream, so the outcome is unknown, never free.
    redis.call('HSET', KEYS[1], 'state', 'unknown', 'unknown_at', ms(now))
    redis.call('HDEL', KEYS[1], 'owner')
    return {'unknown', r[4]}
end

if r[2] == 'unknown' then
    return {'unknown', r[4]}
end

return corrupt('state')
