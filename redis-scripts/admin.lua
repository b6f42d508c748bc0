-- An operator resolves a record whose outcome is unknown (or whose owner
-- vanished): release it so a retry executes, or mark it completed with a
-- status learned out of band.  Completed records and live claims are left
-- alone.
--
--: args action status ttl
--
-- KEYS[1]  record key
-- action   "release" or "complete"
-- status   status (complete only)
-- ttl      retention TTL in seconds (complete only)
--
-- Replies: {"released"} | {"completed"} | {"none"} | {"refused", state}

local now = now_ms()

local r = redis.call('HMGET', KEYS[1], 'v', 'state', 'lease', 'waiters')

if not r[2] then
    return {'none'}
end

if r[1] ~= '1' then
    return corrupt('layout')
end

local stuck = r[2] == 'unknown'
    or (r[2] == 'in_progress' and tonumber(r[3] or '0') <= now)

if not stuck then
    return {'refused', r[2]}
end

announce(KEYS[1], r[4])

if action == 'release' then
    redis.call('DEL', KEYS[1])
    return {'released'}
end

redis.call('HSET', KEYS[1],
           'state', 'completed', 'status', status, 'hdr', '', 'body', '',
           'stored', '1', 'completed', ms(now), 'resolved', '1')
redis.call('HDEL', KEYS[1], 'owner', 'lease')
redis.call('EXPIRE', KEYS[1], ttl)

return {'completed'}
