-- Record the upstream's final response, if this attempt still owns the
-- claim.
--
--: needs audit
--: args owner value ttl
--
-- KEYS[1]  record key
-- KEYS[2]  idempotency_audit: the stream ("accepted", "completed")
-- KEYS[3]  its head key (audit.lua)
-- owner    owner token
-- value    the completed record (layout 2), built by the module
-- ttl      retention TTL in ms
--
-- Reply: 1 when recorded, 0 when the claim was lost (lease lapsed,
-- resolved); with the audit, see audit.lua.

local v = redis.call('GET', KEYS[1])

if not owned(v, owner) then
    return 0
end

local stop = audit_gate(nargs + 1, KEYS[2])

if stop then
    return stop
end

announce(KEYS[1], v)
redis.call('SET', KEYS[1], value, 'PX', ttl)

-- 1 says the entries were appended too: no {"audited", 1} to build
-- (a table and its reply: half a microsecond of a first write)
return 1
