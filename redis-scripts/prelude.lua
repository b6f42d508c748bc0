-- Shared by every script: prepended to each at build time (after
-- head.lua), then the files it names in its "--: needs" line, then a line
-- that names its ARGV (its "--: args" line) as locals.
--
-- The record is one string, layout 2 (docs/states.md): a fixed head,
-- the layout, the state (i, c, u, r, a, p, d, s), the waiters flag, the
-- operation id (32 hex), the fingerprint (64 hex) and the owner token (32
-- hex or 32 '-'), then netstring fields.  Lua reads and writes the head
-- only through head.lua's helpers.
--
-- Numbers are written with string.format('%d'): tostring() of a Lua number
-- goes through '%.14g', glibc's float printer, a measurable part of a
-- script's time in Redis (bench/RESULTS.md).  Numbers from ARGV stay
-- strings for the same reason.  '%d' is a C long: Redis must be a 64-bit
-- build (docs/redis.md).

local function ms(n)
    return string.format('%d', n)
end

-- The record is a live claim held by this attempt's owner token: only then
-- may a closing script (complete, release, fail) or a renewal touch it.
local function owned(v, token)
    return v and in_state(v, 'i') and owner_of(v) == token
end

-- A claim's owner writes its completion beside the record, by a native
-- SET of <record key>:c:<owner token> (docs/states.md): no script on a
-- first write.  It counts only while the record is still that owner's
-- claim, so a late completion of a claim taken from its owner lands where
-- nobody reads.  Before the completion the same key may hold "w" (a
-- duplicate waits: the owner announces its completion) or "x" (the claim
-- was taken from its owner, who logs that its completion was lost).
local function done_key(key, v)
    return key .. ':c:' .. owner_of(v)
end

-- the completion written beside claim v of key, or nil
local function done_of(key, v)
    if not in_state(v, 'i') then
        return nil
    end
    local c = redis.call('GET', done_key(key, v))
    if c and in_state(c, 'c') then
        return c
    end
    return nil
end

-- tell whoever waits for record key (idempotency_wait) that it changed
local function publish(key)
    redis.call('PUBLISH', '@IDEM_CHANNEL@', key)
end

-- Somebody waits for this record (idempotency_wait): tell them it changed.
-- The waiter's mark beside a claim is not needed any more.
local function announce(key, v)
    if waiters_of(v) == '1' then
        publish(key)
        if state_of(v) == 'i' then
            redis.call('DEL', done_key(key, v))
        end
    end
end

-- Claim v of key is taken from its owner (its lease lapsed, an operator
-- resolved it): a completion the owner may still write beside it meets
-- "x", and the owner logs that it was not recorded.
local function disown(key, v)
    local left = redis.call('PTTL', key)
    if left > 0 then
        redis.call('SET', done_key(key, v), 'x', 'PX', left)
    end
end

-- The unique and lock keys (idempotency_unique, idempotency_lock) name the
-- record that holds them, which alone says whether they are held: a name
-- that outlives its record is harmless, one that lapses first would free
-- the identity or the lock of a live record.  So they live twice the
-- record's TTL from the claim and from each renewal, and the record (its
-- retention TTL set at completion, or at an operator's resolve, within one
-- TTL of the last renewal) always ends first.
local function business_ttl(ttl)
    return ms(2 * tonumber(ttl))
end
