-- Claim (scope, key) for one attempt, or report what already holds it.
-- One script, so the check and the claim are a single atomic step.
--
-- KEYS[1]  record key
-- ARGV[1]  request fingerprint (64 hex)
-- ARGV[2]  owner token (fences complete/release/fail)
-- ARGV[3]  operation id for a new record
-- ARGV[4]  lease in milliseconds
-- ARGV[5]  retention TTL in seconds
-- ARGV[6]  "1" when the caller waits for an in-flight attempt to finish
--
-- Replies (all strings):
--   {"claimed", op}
--   {"completed", op, status, headers, body, stored}
--   {"mismatch", op, state}
--   {"in_progress", op, lease_left_ms}
--   {"unknown", op}

-- Times are written with string.format('%d'): tostring() of a Lua number
-- goes through '%.14g', glibc's float printer, a measurable part of a claim's
-- time in Redis (bench/RESULTS.md).  Numbers from ARGV stay strings for the
-- same reason.  '%d' is a C long: Redis must be a 64-bit build (docs/redis.md).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- one read for every answer: a replay needs no second call for its response
local r = redis.call('HMGET', KEYS[1], 'v', 'state', 'fp', 'op', 'lease',
                     'status', 'hdr', 'body', 'stored')

if not r[2] and redis.call('EXISTS', KEYS[1]) == 1 then
    -- another application's hash under our name: never write into it
    return redis.error_reply('IDEMCORRUPT record has an unknown layout')
end

if not r[2] then
    redis.call('HSET', KEYS[1],
               'v', '1', 'state', 'in_progress', 'fp', ARGV[1],
               'owner', ARGV[2], 'op', ARGV[3],
               'lease', string.format('%d', now + tonumber(ARGV[4])),
               'created', string.format('%d', now))
    redis.call('EXPIRE', KEYS[1], ARGV[5])
    return {'claimed', ARGV[3]}
end

if r[1] ~= '1' or not r[3] or not r[4] then
    return redis.error_reply('IDEMCORRUPT record has an unknown layout')
end

if r[3] ~= ARGV[1] then
    return {'mismatch', r[4], r[2]}
end

if r[2] == 'completed' then
    return {'completed', r[4], r[6] or '', r[7] or '', r[8] or '', r[9] or '0'}
end

if r[2] == 'in_progress' then
    local left = tonumber(r[5] or '0') - now
    if left > 0 then
        if ARGV[6] == '1' then
            -- whoever closes this record announces it (idempotency_wait)
            redis.call('HSET', KEYS[1], 'waiters', '1')
        end
        return {'in_progress', r[4], string.format('%d', left)}
    end
    -- The owner stopped renewing its lease: it may or may not have reached
    -- the upstream, so the outcome is unknown, never free.
    redis.call('HSET', KEYS[1], 'state', 'unknown', 'unknown_at', string.format('%d', now))
    redis.call('HDEL', KEYS[1], 'owner')
    return {'unknown', r[4]}
end

if r[2] == 'unknown' then
    return {'unknown', r[4]}
end

return redis.error_reply('IDEMCORRUPT record has an unknown state')
