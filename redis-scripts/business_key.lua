-- A business key (idempotency_unique, idempotency_lock) on a Redis
-- Cluster, in its own slot: the second step of a claim there, its
-- renewals and its giving back (docs/business-keys.md, "On a Redis
-- Cluster").  The key only names the operation that took it; whether that
-- operation holds it is read from its record, in the record's slot
-- (business_holder.lua), before this attempt replaces the name.
--
--: args mode name expect ttl
--
-- KEYS[1]  the unique or lock key
-- mode     "take": take the key for name when it is absent, names name
--          already, or names exactly expect (the holder the caller found
--          to hold nothing); "keep": PEXPIRE ttl while it names name, or
--          set it to name when absent (only an operation let run keeps:
--          a key lost with a failover names it again, and a name alone
--          grants nothing); "drop": DEL while it names name
-- name     this attempt's value: its record key, its operation id, the
--          tag of its location (unique) or of its scope (lock)
-- expect   "take": the value the caller found not holding, or ""
-- ttl      the key's TTL in ms (twice the record's)
--
-- Replies: take: {"taken"} | {"named", value}: another operation's name,
--          unchanged; keep, drop: 1 | 0 (it names another operation:
--          for keep, one that took it while this one runs)

local h = redis.call('GET', KEYS[1])

if mode == 'keep' and not h then
    redis.call('SET', KEYS[1], name, 'PX', ttl)
    return 1
end

if mode ~= 'take' then
    if h ~= name then
        return 0
    end
    if mode == 'drop' then
        redis.call('DEL', KEYS[1])
    else
        redis.call('PEXPIRE', KEYS[1], ttl)
    end
    return 1
end

-- a compare-and-set: a name that changed since the caller read its
-- holder's record was not seen to hold nothing
if h and h ~= name and h ~= expect then
    return {'named', h}
end

redis.call('SET', KEYS[1], name, 'PX', ttl)

return {'taken'}
