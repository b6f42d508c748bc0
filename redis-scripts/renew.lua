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
