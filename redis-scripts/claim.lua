-- The claim when the module's first look (SET key value NX PX ttl GET)
-- is not the whole answer: the key holds a live claim (its lease must be
-- checked against Redis's clock, and a duplicate that waits marks it), a
-- marker of a released attempt, a record of layout 1, or the first look
-- failed.  One script, so the check and the claim are one atomic step.
--
--: first claimfresh
--: needs fields layout1 audit
--: args fp owner value ttl wait waited approved scope loc undo
--
-- KEYS[1]  record key
-- KEYS[2]  idempotency_unique: the unique key of the request's business
--          identity in its scope, or KEYS[1] (absent when neither is set)
-- KEYS[3]  idempotency_lock: the lock key of its value, or KEYS[1]
-- KEYS[4]  with a lock: the record key's sibling "h" (same hash tag),
--          which names the lock this operation takes, for the status
--          endpoint; or KEYS[1]
-- KEYS[#KEYS - 1], KEYS[#KEYS]  idempotency_audit: the stream and its
--          head key, last (when the audit's arguments are there).  Each change of a record goes through gate()
--          with its kind: "claim" (this attempt's value), "approve" (a
--          proposal claimed), "reuse" (this key made an alias) or
--          "unknown" (a lapsed lease), and is made only with its entries
--          (audit.lua); answers change nothing and are appended by the
--          module before they leave (append.lua).
-- fp       the request's fingerprint
-- owner    this attempt's owner token
-- value    the in_progress record to create (layout 2)
-- ttl      its TTL in ms
-- wait     "1" when the caller waits for an attempt in flight
-- waited   the operation id of the attempt this caller waited on, or ""
-- approved "1" when the request carries a valid approval
--          (idempotency_confirm): only then, or with an approval recorded
--          in the record (state p), is a proposal claimed
-- scope    with a lock: the scope's tag, kept with the lock so that only
--          a request of the holder's scope is told the holder's id
-- loc      with an identity: the location's tag, kept with the identity
--          so that only a request of the holder's location is given the
--          holder's answer (idempotency_unique shared=)
-- undo     "1" after the module's native claim (SET ... NX GET of the
--          record, then of each business key, pipelined) did not take them
--          all: what it took, each key still holding exactly what this
--          attempt wrote there, is deleted first (claimfresh.lua), then
--          the claim is decided on the keys as they are
--
-- Replies: {"claimed"} | {"claimed", op[, approver]}: a proposal claimed,
--            its operation id (and, with the approval it recorded, the
--            approver), the operation's from now on
--          | {"record", value} | {"in_progress", value, left}
--          | {"released", marker}
--          | {"reused", value[, left]}: the operation that holds the
--            business identity (completed 2xx, in progress with its lease
--            left, or unknown); this key is now its alias
--          | {"locked", left | "", op id | ""}: another operation holds
--            the lock; nothing was written
--          | {"elsewhere"}: an operation of another location holds the
--            identity (shared=); nothing was written

local stream = ARGV[nargs + 1] and KEYS[#KEYS - 1]
local ukey, lkey, hkey = '', '', ''

-- an absent unique or lock key is passed as the record key itself: an
-- empty name would be refused by an ACL's key pattern
if #KEYS >= 4 then
    ukey = KEYS[2] ~= KEYS[1] and KEYS[2] or ''
    lkey = KEYS[3] ~= KEYS[1] and KEYS[3] or ''
    hkey = KEYS[4] ~= KEYS[1] and KEYS[4] or ''
end

local function gate(kind, basis, reply)
    return audit_gate(nargs + 1, stream, kind, basis, reply)
end

-- The owner stopped renewing its lease: it may or may not have reached
-- the upstream, so the outcome is unknown, never free.
local function unknown_of(v, f)
    return make_head('u', waiters_of(v), op_of(v), fp_of(v))
           .. ns(f[1]) .. ns(ms(now_ms()))
end

local function to_unknown(key, v, u)
    announce(key, v)
    disown(key, v)
    redis.call('SET', key, u, 'KEEPTTL')
    return u
end

-- Operation op of record key rk, for the business identity or the lock
-- it may hold (fields.lua's holds()): its state and value (and its lease
-- left when in flight), or nil.  A claim whose lease lapsed becomes
-- unknown and keeps them; with the audit it is only seen so, and its own
-- key's next claim makes (and records) the change.
local function holder(rk, op)
    local s, v, f, left = holds(rk, op)
    if s ~= 'lapsed' then
        return s, v, left
    end
    if stream then
        return 'u', unknown_of(v, f)
    end
    return 'u', to_unknown(rk, v, unknown_of(v, f))
end

-- The answer of the operation that holds the identity, to a request of
-- another key: that key becomes its alias, so its retries answer the same.
local function reuse(rk, s, hv, left)
    local reply = {'reused', hv}
    if s == 'i' then
        reply[3] = ms(left)
    end
    local stop = gate('reuse', hv, reply)
    if stop then
        return stop
    end
    redis.call('SET', KEYS[1], make_head('s', '0', op_of(hv), fp)
                               .. ns(ms(now_ms())) .. ns(rk), 'PX', ttl)
    return audit_done(reply)
end

local function unique_held()
    local h = ukey ~= '' and redis.call('GET', ukey)
    if not h then
        return nil
    end
    local rk, op, tag = named(h, #KEYS[1])
    local s, hv, left = holder(rk, op)
    -- the holder's answer is its own location's: never handed to another
    if s and tag ~= '' and tag ~= loc then
        return {'elsewhere'}
    end
    return s and reuse(rk, s, hv, left)
end

local function lock_held()
    local h = lkey ~= '' and redis.call('GET', lkey)
    if not h then
        return nil
    end
    local rk, op, tag = named(h, #KEYS[1])
    local s, hv, left = holder(rk, op)
    if s ~= 'i' and s ~= 'u' then
        return nil
    end
    return {'locked', s == 'i' and ms(left) or '', tag == scope and op or ''}
end

-- Take the key with value v, over the record "basis" (or none): kind
-- "claim" with this attempt's value, "approve" with a proposal's (whose
-- answer names the proposal's operation, and its recorded approver).  A
-- claim (not a proposal: nothing runs yet) first takes the business
-- identity and the lock, or is answered by whoever holds them.
local function claim(v, kind, basis, reply)
    reply = reply or {'claimed'}
    if state_of(v) == 'i' then
        local held = unique_held() or lock_held()
        if held then
            return held
        end
    end
    local stop = gate(kind, basis, reply)
    if stop then
        return stop
    end
    if state_of(v) == 'i' then
        local name = KEYS[1] .. op_of(v)
        if ukey ~= '' then
            redis.call('SET', ukey, name .. loc, 'PX', business_ttl(ttl))
        end
        if lkey ~= '' then
            redis.call('SET', lkey, name .. scope, 'PX', business_ttl(ttl))
            -- the lock's name beside the record, as long-lived as the
            -- lock key: the status endpoint cannot derive it (no body)
            if hkey ~= '' then
                redis.call('SET', hkey, name .. lkey, 'PX', business_ttl(ttl))
            end
        end
    end
    redis.call('SET', KEYS[1], v, 'PX', ttl)
    return audit_done(reply)
end

local function layout1_claim(key)
    local r = layout1_read(key)
    if not r then
        return corrupt('layout')
    end
    if r[3] ~= fp or r[2] ~= 'in_progress' then
        return {'record', layout1_value(r)}
    end
    local now = now_ms()
    if not layout1_lapsed(r, now) then
        if wait == '1' then
            -- whoever closes this record announces it
            redis.call('HSET', key, 'waiters', '1')
            r[14] = '1'
        end
        local left = tonumber(r[5]) - now
        return {'in_progress', layout1_value(r, left), ms(left)}
    end
    local basis = layout1_value(r)
    r[2], r[12] = 'unknown', ms(now)
    local reply = {'record', layout1_value(r)}
    local stop = gate('unknown', basis, reply)
    if stop then
        return stop
    end
    redis.call('HSET', key, 'state', 'unknown', 'unknown_at', ms(now))
    redis.call('HDEL', key, 'owner')
    return audit_done(reply)
end

local v = redis.pcall('GET', KEYS[1])

if type(v) == 'table' then
    return layout1_claim(KEYS[1])
end

if not v then
    return claim(value, 'claim')
end

-- a claim whose owner wrote its completion beside it: that completion,
-- from now on in the record's place
local f, state
f, state, v = readable_settled(KEYS[1], v, true)

if not f then
    return state
end

if state == 'r' then
    -- A claim from a connection its worker gave up on must not take the
    -- key: that worker answered its client already.  A duplicate that
    -- waited on the released attempt gets the upstream's "retry later".
    if owner_of(v) == owner
       or (waited ~= '' and op_of(v) == waited and f[1] ~= '')
    then
        return {'released', v}
    end
    return claim(value, 'claim', v)
end

-- An alias answers what the operation it reused answers, while that one
-- holds the identity; after that, this key's own request runs.
if state == 's' and fp_of(v) == fp then
    local s, hv, left = holder(f[2], op_of(v))
    if s then
        return reuse(f[2], s, hv, left)
    end
    return claim(value, 'claim', v)
end

-- A proposal (awaiting_confirmation) becomes the claim of the request
-- it proposed, and only with an approval of that same fingerprint: one
-- the request carries, or one recorded (approved) that has not expired
-- by Redis's clock.  The claim keeps the proposal's operation id: that
-- is what the person approved.
if (state == 'a' or state == 'p') and fp_of(v) == fp
   and state_of(value) == 'i'
   and (approved == '1'
        or (state == 'p' and tonumber(f[3]) > now_ms()))
then
    local reply = {'claimed', op_of(v)}
    if approved ~= '1' then
        reply[3] = f[4]
    end
    return claim(make_head(state_of(value), waiters_of(value), op_of(v),
                      fp_of(value), owner_of(value)) .. fields_of(value),
                 'approve', v, reply)
end

if state ~= 'i' or fp_of(v) ~= fp then
    return {'record', v}
end

local left = lease_left(KEYS[1], f)

if left > 0 then
    if wait == '1' then
        if waiters_of(v) ~= '1' then
            v = make_head('i', '1', op_of(v), fp_of(v), owner_of(v))
                .. fields_of(v)
            redis.call('SET', KEYS[1], v, 'KEEPTTL')
        end
        -- the owner's completion beside the record finds the mark, and
        -- announces itself (prelude.lua)
        redis.call('SET', done_key(KEYS[1], v), 'w', 'NX', 'PX', f[3])
    end
    return {'in_progress', v, ms(left)}
end

-- On a Redis Cluster a claim whose gate is still shut beside it never ran
-- (ngx_http_idempotency_bkeys.c, business_gate.lua): its lapsed lease frees
-- the key, and its worker can no longer open the gate.  (No gate on one
-- server: nothing changes there.)
if redis.call('GET', KEYS[1] .. ':p') == op_of(v) then
    redis.call('DEL', KEYS[1] .. ':p')
    return claim(value, 'claim', v)
end

local u = unknown_of(v, f)
local stop = gate('unknown', v, {'record', u})

if stop then
    return stop
end

return audit_done({'record', to_unknown(KEYS[1], v, u)})
