-- A person's recorded approval (idempotency_approve): the proposal of
-- this operation, with this fingerprint, becomes approved until the given
-- time, by the given approver.  The next attempt with the same key and
-- fingerprint claims it (claim.lua) without carrying anything.  Or the
-- person declines it: the record becomes declined (state d), and no
-- attempt with its key runs while it lives.
--
--: needs fields audit
--: args op fp approver expires_in decision keep
--
-- KEYS[1]     record key
-- KEYS[2]     idempotency_audit: the stream ("approved")
-- KEYS[3]       its head key (audit.lua)
-- op          the operation id the person approved
-- fp          the fingerprint the person saw
-- approver    who approved (non-empty, checked by the module)
-- expires_in  how long the approval holds, in ms
-- decision    "approve", "decline", or "approve_once", "decline_once"
--             (the approval page: an operation decided already is not
--             decided again by a replayed form)
-- keep        a declined record lives at least this long, in ms (the
--             approving location's idempotency_ttl): its key stays
--             refused as a completed one stays answered
--
-- Replies: {"approved", until_ms} | {"declined", at_ms} | {"none"}
--          | {"mismatch"} | {"refused", state}; with the audit, see
--          audit.lua

local names = { i = 'in_progress', c = 'completed', u = 'unknown',
                s = 'alias', d = 'declined', p = 'approved' }
local v = redis.pcall('GET', KEYS[1])

if type(v) == 'table' or not v then
    -- layout 1 never had proposals
    return {'none'}
end

-- a claim completed beside its record is that completion (fields.lua)
local f, state
f, state, v = readable_settled(KEYS[1], v)

if not f then
    return state
end

-- another operation under the same key is not what the person saw
if state == 'r' or op_of(v) ~= op then
    return {'none'}
end

if (state ~= 'a' and state ~= 'p')
   or (state == 'p' and string.find(decision, '_once$')) then
    return {'refused', names[state]}
end

if fp_of(v) ~= fp then
    return {'mismatch'}
end

local stop = audit_gate(nargs + 1, KEYS[2])

if stop then
    return stop
end

local now = now_ms()

-- a decline also ends an approval not claimed yet: the person changed
-- their mind before the operation ran
if string.find(decision, '^decline') then
    local left = redis.call('PTTL', KEYS[1])
    if left < tonumber(keep) then
        left = tonumber(keep)
    end
    redis.call('SET', KEYS[1],
               make_head('d', waiters_of(v), op_of(v), fp_of(v),
                         owner_of(v)) .. ns(f[1]) .. ns(f[2])
               .. ns(ms(now)) .. ns(approver), 'PX', ms(left))
    return audit_done({'declined', ms(now)})
end

local untl = now + tonumber(expires_in)

-- it lives until the approval ends, and never less than the proposal
local left = redis.call('PTTL', KEYS[1])

if left < tonumber(expires_in) then
    left = tonumber(expires_in)
end

redis.call('SET', KEYS[1],
           make_head('p', waiters_of(v), op_of(v), fp_of(v), owner_of(v))
           .. ns(f[1]) .. ns(f[2])
           .. ns(ms(untl)) .. ns(approver),
           'PX', ms(left))

return audit_done({'approved', ms(untl)})
