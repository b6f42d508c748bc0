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
