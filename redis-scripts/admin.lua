-- An operator resolves a record whose outcome is unknown (or whose owner
-- vanished): release it so a retry executes, or mark it completed with a
-- status learned out of band.  Completed records and live claims are left
-- alone.
--
-- KEYS[1]  record key
-- ARGV[1]  "release" or "complete"
-- ARGV[2]  status (complete only)
-- ARGV[3]  retention TTL in seconds (complete only)
--
-- Replies: {"released"} | {"completed"} | {"none"} | {"refused", state}

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local r = redis.call('HMGET', KEYS[1], 'v', 'state', 'lease')

if not r[2] then
    return {'none'}
end

if r[1] ~= '1' then
    return redis.error_reply('IDEMCORRUPT record has an unknown layout')
end

local stuck = r[2] == 'unknown'
    or (r[2] == 'in_progress' and tonumber(r[3] or '0') <= now)

if not stuck then
    return {'refused', r[2]}
end

-- Somebody waits for this record (idempotency_wait): tell them it changed.
if redis.call('HEXISTS', KEYS[1], 'waiters') == 1 then
    redis.call('PUBLISH', 'idem:done', KEYS[1])
end

if ARGV[1] == 'release' then
    redis.call('DEL', KEYS[1])
    return {'released'}
end

redis.call('HSET', KEYS[1],
           'state', 'completed', 'status', ARGV[2], 'hdr', '', 'body', '',
           'stored', '1', 'completed', string.format('%d', now), 'resolved', '1')
redis.call('HDEL', KEYS[1], 'owner', 'lease')
redis.call('EXPIRE', KEYS[1], ARGV[3])

return {'completed'}
