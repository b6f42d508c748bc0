-- Read one record for the status endpoint.  Read-only: a lapsed lease is
-- reported here and converted by the next claim.  The stored response is
-- left out: the endpoint never shows it.
--
--: needs fields layout1
--: args
--
-- KEYS[1]  record key
--
-- Replies: {} when there is no record, else {value, lapsed "0" | "1"};
-- an alias (idempotency_unique) adds the state of the operation it
-- reuses, as that operation's claim would see it, or "" when none

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

local f, state = readable(v)

if not f then
    return state
end

if state == 'r' then
    return {}
end

if state == 's' then
    local ts = holds(f[2], string.sub(v, 4, 35)) or ''
    return {v, '0', ts == 'lapsed' and 'u' or ts}
end

if state == 'c' then
    v = string.sub(v, 1, 131) .. ns(f[1]) .. ns(f[2]) .. ns(f[3]) .. ns(f[4])
        .. ns(f[5]) .. ns('') .. ns('')
end

return {v, (state == 'i' and lapsed(KEYS[1], f)) and '1' or '0'}
