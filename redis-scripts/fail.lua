-- The request was sent but no complete response came back: the upstream may
-- have acted.  Keep the record as "unknown" so nothing re-executes it.
--
--: args owner
--
-- KEYS[1]  record key
-- owner    owner token
--
-- Reply: 1 when marked, 0 when the claim was not ours any more.

local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'waiters')

if not owned(r[1], r[2], owner) then
    return 0
end

announce(KEYS[1], r[3])

redis.call('HSET', KEYS[1], 'state', 'unknown', 'unknown_at', ms(now_ms()))
redis.call('HDEL', KEYS[1], 'owner', 'lease')

return 1
