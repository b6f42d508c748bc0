-- idempotency_audit: the claim of a key the first look (GET) found free,
-- with its entry ("attempted", "sent"), on a location without
-- idempotency_unique or idempotency_lock.  What claim.lua does for a free
-- key, without defining what it needs for every other case: that is most
-- of the audited first write's Redis time (bench/RESULTS.md).  A key that
-- is not free any more (another attempt claimed it since the look) is
-- left to claim.lua: the module sends it the same command
-- (ngx_http_idempotency_audit.c).
--
--: needs audit
--: args value ttl
--
-- KEYS[1]  record key
-- KEYS[2]  the stream
-- KEYS[3]  its head key (audit.lua)
-- value, ttl  claim.lua's: the module does not send claim.lua's other
--          arguments here (the command's "skip"), each a Lua string made
--          for nothing on every call
--
-- The record is taken first, by SET NX (what the look found free is
-- still free, or nothing is written), and given back (DEL) in this same
-- script when the entry cannot go in: no one ever sees the claim without
-- its entry, and the EXISTS of a check before it is spared.  An error
-- inside the audit's part (a head key of another type) gives it back too.
--
-- Replies: {"audit-look"}: the key is not free, nothing was written;
-- 1: claimed, with the entry (claim.lua's {"audited", {"claimed"}}, as a
-- number: the table and its reply cost a first write about a
-- microsecond); else audit.lua's "audit-head", nothing written.

if not redis.call('SET', KEYS[1], value, 'NX', 'PX', ttl) then
    return {'audit-look'}
end

-- "claim" is the only decision made here: audit-decide never comes back
local ok, stop = pcall(audit_gate, nargs + 1, KEYS[2], 'claim')

if not ok or stop then
    redis.call('DEL', KEYS[1])
    if not ok then
        error(stop)
    end
    return stop
end

return 1
