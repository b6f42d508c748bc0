-- Extend the lease of a claim while its request is alive: the claim's TTL
-- starts again, and the lease is measured from it (docs/states.md).
--
--: args owner ttl
--
-- KEYS[1]  record key
-- KEYS[2]  the unique key the claim took (idempotency_unique), or KEYS[1]
-- KEYS[3]  the lock key it took (idempotency_lock), or KEYS[1]
-- KEYS[4]  with a lock, the key beside the record that names it
--          (claim.lua), or KEYS[1]
--          (all three absent when the request has neither)
-- owner    owner token
-- ttl      the claim's TTL in ms (its "ttl ms" field)
--
-- Reply: 1 when extended, 0 when the claim was not ours any more.

local v = redis.call('GET', KEYS[1])

-- completed beside the record: its retention runs from the last renewal
if not owned(v, owner) or done_of(KEYS[1], v) then
    return 0
end

redis.call('PEXPIRE', KEYS[1], ttl)

-- On a Redis Cluster a claim is renewed only once its gate was opened
-- (business_gate.lua): a gate that still names it is an opening lost with
-- a failover of this master (asynchronous replication), which would make
-- an operation that ran look never run, to be taken over and run again
-- once it turns unknown.  Opened again here.  (No gate on one server.)
if redis.call('GET', KEYS[1] .. ':p') == op_of(v) then
    redis.call('DEL', KEYS[1] .. ':p')
end

-- the identity and the lock this operation took keep outliving its
-- record (prelude.lua); their values, and that of the key naming the
-- lock, name the operation (fields.lua)
local name = KEYS[1] .. op_of(v)

for i = 2, #KEYS do
    local h = KEYS[i] ~= KEYS[1] and redis.call('GET', KEYS[i])
    if h and string.sub(h, 1, #name) == name then
        redis.call('PEXPIRE', KEYS[i], business_ttl(ttl))
    end
end

return 1
