-- Give the key back: the upstream never received the request, or answered
-- "not done, try later" (idempotency_release_statuses), or the claim was
-- sent on a connection the worker gave up on.  Fenced by the owner token.
--
--: needs audit
--: args owner marker ttl absent
--
-- KEYS[1]  record key
-- KEYS[2]  idempotency_audit: the stream ("accepted", "released"); a
--          marker left for a claim that has not run is not an event
-- KEYS[3]  its head key (audit.lua)
-- owner    owner token
-- marker   what stays for ttl ms (layout 2, state r), or "" for nothing
-- ttl      the marker's TTL in ms
-- absent   "1": the claim may not have run yet; then the marker is left
--          even when there is no record, so that it cannot take the key
--          when it runs
--
-- Reply: 1 when released, 0 when the claim was not ours any more, 2 when
-- a marker was left for a claim that has not run; with the audit, see
-- audit.lua.

local v = redis.call('GET', KEYS[1])

if not v then
    if absent == '1' then
        redis.call('SET', KEYS[1], marker, 'PX', ttl)
        return 2
    end
    return 0
end

if not owned(v, owner) then
    return 0
end

local stop = audit_gate(nargs + 1, KEYS[2])

if stop then
    return stop
end

announce(KEYS[1], v)

if marker == '' then
    redis.call('DEL', KEYS[1])
else
    redis.call('SET', KEYS[1], marker, 'PX', ttl)
end

-- 1 says the entries were appended too: no {"audited", 1} to build
-- (a table and its reply: half a microsecond of a first write)
return 1
