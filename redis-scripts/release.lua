-- Forget a claim whose request never reached the upstream, so that a retry
-- executes.  Fenced by the owner token.
--
--: args owner
--
-- KEYS[1]  record key
-- owner    owner token
--
-- Reply: 1 when released, 0 when the claim was not ours any more.

local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'waiters')

if not owned(r[1], r[2], owner) then
    return 0
end

announce(KEYS[1], r[3])

redis.call('DEL', KEYS[1])

return 1
