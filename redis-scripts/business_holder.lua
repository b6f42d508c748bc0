-- Whether the operation a business key names holds it, on a Redis
-- Cluster: read in that operation's record, in the record's own slot
-- (docs/business-keys.md, "On a Redis Cluster").  The same decision as
-- claim.lua's unique_held() and lock_held() on one server.
--
--: needs fields
--: args op kind same
--
-- KEYS[1]  the record key the business key names
-- op       the operation id it names
-- kind     "u": a unique key (idempotency_unique); "l": a lock key
-- same     "1" when the name's tag is the asking request's: its location
--          (unique: only then is the holder's answer its own) or its scope
--          (lock: only then is it told the holder's id)
--
-- Replies: {"free"}: the operation holds nothing (and never will again:
--            its id is never claimed anew)
--          | {"reused", value[, left]} | {"elsewhere"}   (kind "u")
--          | {"locked", left | "", op | ""}              (kind "l")
--          the same replies as claim.lua's

-- A claim whose owner stopped renewing may or may not have reached the
-- upstream: unknown, never free (as claim.lua's holder() does).
local function to_unknown(key, v, f)
    local u = make_head('u', waiters_of(v), op_of(v), fp_of(v))
              .. ns(f[1]) .. ns(ms(now_ms()))
    announce(key, v)
    disown(key, v)
    redis.call('SET', key, u, 'KEEPTTL')
    return u
end

local s, v, f, left = holds(KEYS[1], op)

-- A claim whose gate is still shut never ran (business_gate.lua): once its
-- lease has lapsed it is taken over, record and gate deleted, so that its
-- worker, should it still be alive, can no longer open the gate.
if (s == 'lapsed' or s == 'u')
   and redis.call('GET', KEYS[1] .. ':p') == op
then
    announce(KEYS[1], v)
    redis.call('DEL', KEYS[1], KEYS[1] .. ':p')
    return {'free'}
end

if s == 'lapsed' then
    s, v = 'u', to_unknown(KEYS[1], v, f)
end

if kind == 'u' then
    if not s then
        return {'free'}
    end
    if same ~= '1' then
        return {'elsewhere'}
    end
    if s == 'i' then
        return {'reused', v, ms(left)}
    end
    return {'reused', v}
end

if s ~= 'i' and s ~= 'u' then
    return {'free'}
end

return {'locked', s == 'i' and ms(left) or '', same == '1' and op_of(v) or ''}
