-- Read one record for the status endpoint.  Read-only: a lapsed lease is
-- reported here and converted by the next claim.  The stored response is
-- left out: the endpoint never shows it.
--
--: needs fields layout1
--: args
--
-- KEYS[1]  record key
-- KEYS[2]  the record key's sibling "h": the lock its operation took
--          (idempotency_lock), as claim.lua named it; absent on a Redis
--          Cluster, where the "h" key (named by business_gate.lua) is read
--          undeclared: a script of two keys in a migrating slot would refuse
--          the script (TRYAGAIN) whenever "h" is missing
--
-- Replies: {} when there is no record, else {value, lapsed "0" | "1"};
-- an alias (idempotency_unique) adds the state of the operation it
-- reuses, as that operation's claim would see it, or "" when none; an
-- operation in progress or unknown adds the name of the lock key it
-- holds now, if any; on a Redis Cluster, where the lock key is in another
-- slot, the one "h" names for it, which the caller checks there (it holds
-- the lock while the lock key names the record key and operation id)

local v = redis.pcall('GET', KEYS[1])

if type(v) == 'table' then
    local r = layout1_read(KEYS[1])
    if not r then
        return corrupt('layout')
    end
    r[9], r[10] = '', ''
    return {layout1_value(r), layout1_lapsed(r, now_ms()) and '1' or '0'}
end

if not v then
    return {}
end

-- a claim completed beside its record is shown as that completion
local f, state
f, state, v = readable_settled(KEYS[1], v)

if not f then
    return state
end

if state == 'r' then
    return {}
end

if state == 's' then
    local ts = holds(f[2], op_of(v)) or ''
    return {v, '0', ts == 'lapsed' and 'u' or ts}
end

-- The lock this operation holds now: the one the "h" key names for it,
-- while that lock key still names this operation (claim.lua's own test,
-- with the record in progress or unknown).  Anything else under either
-- key (another operation's, a lock taken over since, a foreign value)
-- is no lock of this one.
local function lock_of(op)
    local h = redis.pcall('GET', KEYS[2] or ((string.gsub(KEYS[1], '}:r$', '}:h'))))
    if type(h) ~= 'string' then
        return nil
    end
    local rk, hop, lk = named(h, #KEYS[1])
    -- a lock key is the record key's prefix (up to its hash tag's "{"),
    -- 32 hex digits and "}:l"
    local prefix = string.match(KEYS[1], '^[^{]*{')
    if rk ~= KEYS[1] or hop ~= op or #lk ~= #KEYS[1]
       or string.sub(lk, 1, #prefix) ~= prefix
       or not string.find(lk, '^[0-9a-f]+}:l$', #prefix + 1) then
        return nil
    end
    if not KEYS[2] then
        return lk
    end
    local l = redis.pcall('GET', lk)
    if type(l) ~= 'string' then
        return nil
    end
    rk, hop = named(l, #KEYS[1])
    return rk == KEYS[1] and hop == op and lk or nil
end

if state == 'i' or state == 'u' then
    local lapse = (state == 'i' and lapsed(KEYS[1], f)) and '1' or '0'
    local lk = lock_of(op_of(v))
    if lk then
        return {v, lapse, lk}
    end
    return {v, lapse}
end

if state == 'c' then
    v = head_of(v) .. ns(f[1]) .. ns(f[2]) .. ns(f[3]) .. ns(f[4])
        .. ns(f[5]) .. ns('') .. ns('')
end

return {v, (state == 'i' and lapsed(KEYS[1], f)) and '1' or '0'}
