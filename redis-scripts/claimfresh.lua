-- claim.lua's first cases, before its needs are defined.  With undo: the
-- give-back of the module's native claim (below).  Then a first write
-- with idempotency_unique or idempotency_lock whose record, unique key and
-- lock key are all absent, without the audit.  claim.lua would find each
-- of them absent, hold nothing against the claim, and write the same
-- values with the same TTLs; here each absent key is taken by the SET
-- that finds it absent (NX ... GET), and no function of fields.lua,
-- layout1.lua, audit.lua or claim.lua is made for it (bench/RESULTS.md,
-- "idempotency_unique and idempotency_lock: the fresh claim").  On one
-- server the module claims such a write natively (SET ... NX GET of
-- each key, pipelined) and comes here only when that did not take them
-- all, or where it does not apply (a duplicate that waits).
--
-- A key present (a retry, the identity or lock of another operation, a
-- record of layout 1 or another type: the SET answers its value or an
-- error) gives back what this took, by DEL of keys that were absent, so
-- that claim.lua decides on the keys as they were, within the same atomic
-- script.  A proposal (value not in_progress) or audit arguments: claim.lua
-- decides, as before.  KEYS and ARGV as claim.lua's; only the commands of
-- the documented ACL user (docs/redis.md).

-- The give-back of the module's native claim (ngx_http_idempotency_
-- claim_business.c: SET ... NX PX ... GET of the record, then of the
-- unique key, the lock key and the h key, pipelined) when it did not take
-- every key: each key that still holds exactly what this attempt wrote
-- there is deleted, by a compare, never a plain DEL (between the SETs and
-- this, a competitor may have replaced a name of ours, and its name must
-- stay: docs/business-keys.md, "The native claim").  The business keys
-- first, then the record; all in this one atomic script, before the claim
-- below decides on the keys as they then are.  The operation id is this
-- attempt's alone, so only this attempt's writes compare equal.
if undo == '1' and #KEYS >= 4 then
    local name = KEYS[1] .. op_of(value)
    local function claimfresh_undo(key, v)
        if key ~= KEYS[1] and redis.pcall('GET', key) == v then
            redis.call('DEL', key)
        end
    end
    claimfresh_undo(KEYS[2], name .. loc)
    claimfresh_undo(KEYS[3], name .. scope)
    claimfresh_undo(KEYS[4], name .. KEYS[3])
    -- the record: still this attempt's claim (a duplicate that waits may
    -- have marked it; it is told the record changed)
    local v = redis.pcall('GET', KEYS[1])
    if type(v) == 'string' and owned(v, owner)
       and op_of(v) == op_of(value)
    then
        announce(KEYS[1], v)
        redis.call('DEL', KEYS[1])
    end
end

local function claimfresh_take(key, v, px)
    return not redis.pcall('SET', key, v, 'NX', 'PX', px, 'GET')
end

if #KEYS >= 4 and not ARGV[nargs + 1] and in_state(value, 'i') then
    local name = KEYS[1] .. op_of(value)
    local unique, lock = KEYS[2] ~= KEYS[1], KEYS[3] ~= KEYS[1]
    local bttl = business_ttl(ttl)
    -- the business keys first: a retry, a reuse or a refused lock finds
    -- one of them present before this has taken anything to give back
    if not unique or claimfresh_take(KEYS[2], name .. loc, bttl)
    then
        if not lock
           or claimfresh_take(KEYS[3], name .. scope, bttl)
        then
            if claimfresh_take(KEYS[1], value, ttl) then
                -- the lock's name beside the record (claim.lua)
                if lock and KEYS[4] ~= KEYS[1] then
                    redis.call('SET', KEYS[4], name .. KEYS[3], 'PX', bttl)
                end
                return {'claimed'}
            end
            if lock then
                redis.call('DEL', KEYS[3])
            end
        end
        if unique then
            redis.call('DEL', KEYS[2])
        end
    end
end
