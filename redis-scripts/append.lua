-- idempotency_audit: the entries of an answer that changed no record (a
-- replay, a conflict, an answer "in progress", "unknown" or "retry
-- later"): the module appends them before the answer leaves, so that
-- every answer it gives is in the stream (docs/audit.md).
--
--: needs audit
--: args
--
-- KEYS[1]  the record key the entries are about (not read)
-- KEYS[2]  the stream
-- KEYS[3]  its head key (audit.lua)
--
-- Reply: {"audited", 1}, or audit.lua's "audit-head".

local stop = audit_gate(nargs + 1, KEYS[2])

if stop then
    return stop
end

return audit_done(1)
