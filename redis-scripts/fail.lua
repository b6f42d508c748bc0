-- The request was sent but no complete response came back: the upstream
-- may have acted.  Keep the record as "unknown" so nothing re-executes it.
--
--: args owner value
--
-- KEYS[1]  record key
-- owner    owner token
-- value    the unknown record (layout 2), built by the module
--
-- Reply: 1 when marked, 0 when the claim was not ours any more.

local v = redis.call('GET', KEYS[1])

if not owned(v, owner) then
    return 0
end

announce(KEYS[1], v)
redis.call('SET', KEYS[1], value, 'KEEPTTL')

return 1
