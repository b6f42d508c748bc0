-- Extend the lease of a claim while its request is alive: the claim's TTL
-- starts again, and the lease is measured from it (docs/states.md).
--
--: args owner ttl
--
-- KEYS[1]  record key
-- owner    owner token
-- ttl      the claim's TTL in ms (its "ttl ms" field)
--
-- Reply: 1 when extended, 0 when the claim was not ours any more.

local v = redis.call('GET', KEYS[1])

if not owned(v, owner) then
    return 0
end

redis.call('PEXPIRE', KEYS[1], ttl)

return 1
