-- Shared by every script: prepended to each at build time, then the files
-- it names in its "--: needs" line, then a line that names its ARGV (its
-- "--: args" line) as locals.
--
-- The record is one string, layout 2 (docs/states.md): a 131-byte head,
-- '2', the state (i, c, u, r, a, p, s), the waiters flag, the operation id (32 hex),
-- the fingerprint (64 hex) and the owner token (32 hex or 32 '-'), then
-- netstring fields.  Lua reads the head at fixed offsets.
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
    return v and string.sub(v, 1, 2) == '2i'
           and string.sub(v, 100, 131) == token
end

-- Somebody waits for this record (idempotency_wait): tell them it changed.
local function announce(key, v)
    if string.sub(v, 3, 3) == '1' then
        redis.call('PUBLISH', '@IDEM_CHANNEL@', key)
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
