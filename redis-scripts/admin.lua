-- An operator resolves a record whose outcome is unknown (or whose owner
-- vanished): release it so a retry executes, or mark it completed with a
-- status learned out of band.  Completed records and live claims are left
-- alone.
--
--: needs fields layout1 audit
--: args action status ttl
--
-- KEYS[1]  record key
-- KEYS[2]  idempotency_audit: the stream ("resolved"); the entry is made
--          for the record it resolves, so the module learns which first
--          (kind "resolve", audit.lua)
-- KEYS[3]  its head key (audit.lua)
-- action   "release" or "complete"
-- status   status (complete only)
-- ttl      retention TTL in ms (complete only)
--
-- Replies: {"released"} | {"completed"} | {"none"} | {"refused", state};
-- with the audit, see audit.lua

-- a proposal (a, p, d) has not run: nothing to resolve, it expires
local names = { i = 'in_progress', c = 'completed', u = 'unknown',
                a = 'awaiting_confirmation', p = 'approved', s = 'alias',
                d = 'declined' }
local now = now_ms()
local v = redis.pcall('GET', KEYS[1])
local state, stuck, head, created

if type(v) == 'table' then
    local r = layout1_read(KEYS[1])
    if not r then
        return corrupt('layout')
    end
    v = layout1_value(r)
    state = state_of(v)
    stuck = state == 'u' or layout1_lapsed(r, now)
    created = r[6] or '0'
else
    if not v then
        return {'none'}
    end
    local f, st = readable(v)
    if not f then
        return st
    end
    state = st
    if state == 'r' then
        return {'none'}
    end
    -- completed beside its record (prelude.lua): nothing to resolve
    if state == 'i' and done_of(KEYS[1], v) then
        return {'refused', names.c}
    end
    stuck = state == 'u' or (state == 'i' and lapsed(KEYS[1], f))
    created = f[1]
end

if not stuck then
    return {'refused', names[state]}
end

local stop = audit_gate(nargs + 1, KEYS[2], 'resolve', v,
                        {action == 'release' and 'released' or 'completed'})

if stop then
    return stop
end

announce(KEYS[1], v)

if state == 'i' then
    disown(KEYS[1], v)
end

redis.call('DEL', KEYS[1])

if action == 'release' then
    return audit_done({'released'})
end

redis.call('SET', KEYS[1],
           make_head('c', '0', op_of(v), fp_of(v))
           .. ns(created) .. ns(ms(now)) .. ns(status) .. ns('1') .. ns('1')
           .. ns('') .. ns(''),
           'PX', ttl)

return audit_done({'completed'})
