-- The request was sent but no complete response came back: the upstream
-- may have acted.  Keep the record as "unknown" so nothing re-executes it.
--
--: needs audit
--: args owner value
--
-- KEYS[1]  record key
-- KEYS[2]  idempotency_audit: the stream ("accepted", "unknown")
-- KEYS[3]  its head key (audit.lua)
-- owner    owner token
-- value    the unknown record (layout 2), built by the module
--
-- Reply: 1 when marked, 0 when the claim was not ours any more; with the
-- audit, see audit.lua.

local v = redis.call('GET', KEYS[1])

if not owned(v, owner) then
    return 0
end

local stop = audit_gate(nargs + 1, KEYS[2])

if stop then
    return stop
end

announce(KEYS[1], v)

-- it was let run: a gate still naming it is an opening lost with a
-- failover (renew.lua), and must not make it look never run
if redis.call('GET', KEYS[1] .. ':p') == op_of(v) then
    redis.call('DEL', KEYS[1] .. ':p')
end

redis.call('SET', KEYS[1], value, 'KEEPTTL')

-- 1 says the entries were appended too: no {"audited", 1} to build
-- (a table and its reply: half a microsecond of a first write)
return 1
