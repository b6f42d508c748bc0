-- The gate of a claim on a Redis Cluster with business keys
-- (docs/business-keys.md, "On a Redis Cluster"): <record key>:p, beside
-- the record (the same slot), holds the operation id of a claim that has
-- not yet been let through to the upstream.  While it is there, the claim
-- provably has not run: a competitor that finds the claim's lease lapsed
-- may take it over (business_holder.lua).  Opening it is the one step
-- that lets the request run, a compare in the record's slot, so a
-- takeover and the opening are ordered by Redis: one of them wins.
--
--: args mode op owner ttl lock
--
-- KEYS[1]  record key
-- mode     "shut": set the gate (before any business key names op);
--          "open": delete it, only while it names op and the record is
--          still the claim of owner; "drop": delete it while it names op
-- op       the claim's operation id
-- owner    its owner token ("open")
-- ttl      the gate's TTL in ms ("shut"), the lock's name's ("open")
-- lock     "open": the lock key this claim took (idempotency_lock), or "":
--          named beside the record in its "h" key, as claim.lua does on
--          one server, for the status endpoint (which has the key, not the
--          body the lock key is derived from); it grants nothing
--
-- Reply: 1 when done, 0 when not ("open": taken over, or no longer this
-- owner's claim: the request must not run).

local gate = KEYS[1] .. ':p'

if mode == 'shut' then
    redis.call('SET', gate, op, 'PX', ttl)
    return 1
end

if redis.call('GET', gate) ~= op then
    return 0
end

if mode == 'open' and not owned(redis.call('GET', KEYS[1]), owner) then
    return 0
end

redis.call('DEL', gate)

if mode == 'open' and lock ~= '' then
    redis.call('SET', (string.gsub(KEYS[1], '}:r$', '}:h')),
               KEYS[1] .. op .. lock, 'PX', ttl)
end

return 1
