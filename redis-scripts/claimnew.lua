-- idempotency_audit: the claim of a key the first look (GET) found free,
-- with its entry ("attempted", "sent"), on a location without
-- idempotency_unique or idempotency_lock.  What claim.lua does for a free
-- key, without defining what it needs for every other case: that is most
-- of the audited first write's Redis time (bench/RESULTS.md).  A key that
-- is not free any more (another attempt claimed it since the look) is
-- left to claim.lua: the module sends it the same arguments
-- (ngx_http_idempotency_audit.c).
--
--: needs audit
--: args fp owner value ttl wait waited approved scope loc undo
--
-- KEYS[1]  record key
-- KEYS[2]  the stream
-- KEYS[3]  its head key (audit.lua)
-- the arguments are claim.lua's (only value and ttl are read)
--
-- Replies: {"audit-look"}: the key is not free, nothing was written;
-- else claim.lua's for a free key: {"audited", {"claimed"}}, or
-- audit.lua's "audit-head".

if redis.call('EXISTS', KEYS[1]) == 1 then
    return {'audit-look'}
end

local stop = audit_gate(nargs + 1, KEYS[2], 'claim', nil, {'claimed'})

if stop then
    return stop
end

redis.call('SET', KEYS[1], value, 'PX', ttl)

return audit_done({'claimed'})
