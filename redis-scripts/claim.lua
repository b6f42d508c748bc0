-- The claim when the module's first look (SET key value NX PX ttl GET)
-- is not the whole answer: the key holds a live claim (its lease must be
-- checked against Redis's clock, and a duplicate that waits marks it), a
-- marker of a released attempt, a record of layout 1, or the first look
-- failed.  One script, so the check and the claim are one atomic step.
--
--: needs fields layout1
--: args fp owner value ttl wait waited approved
--
-- KEYS[1]  record key
-- fp       the request's fingerprint
-- owner    this attempt's owner token
-- value    the in_progress record to create (layout 2)
-- ttl      its TTL in ms
-- wait     "1" when the caller waits for an attempt in flight
-- waited   the operation id of the attempt this caller waited on, or ""
-- approved "1" when the request carries a valid approval
--          (idempotency_confirm): only then, or with an approval recorded
--          in the record (state p), is a proposal claimed
--
-- Replies: {"claimed"} | {"record", value} | {"in_progress", value, left}
--          | {"released", marker}

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
    redis.call('HSET', key, 'state', 'unknown', 'unknown_at', ms(now))
    redis.call('HDEL', key, 'owner')
    r[2], r[12] = 'unknown', ms(now)
    return {'record', layout1_value(r)}
end

local v = redis.pcall('GET', KEYS[1])

if type(v) == 'table' then
    return layout1_claim(KEYS[1])
end

if not v then
    redis.call('SET', KEYS[1], value, 'PX', ttl)
    return {'claimed'}
end

local f, state = readable(v)

if not f then
    return state
end

if state == 'r' then
    -- A claim from a connection its worker gave up on must not take the
    -- key: that worker answered its client already.  A duplicate that
    -- waited on the released attempt gets the upstream's "retry later".
    if string.sub(v, 100, 131) == owner
       or (waited ~= '' and string.sub(v, 4, 35) == waited and f[1] ~= '')
    then
        return {'released', v}
    end
    redis.call('SET', KEYS[1], value, 'PX', ttl)
    return {'claimed'}
end

-- A proposal (awaiting_confirmation) becomes the claim of the request
-- it proposed, and only with an approval of that same fingerprint: one
-- the request carries, or one recorded (approved) that has not expired
-- by Redis's clock.  The claim keeps the proposal's operation id: that
-- is what the person approved.
if (state == 'a' or state == 'p') and string.sub(v, 36, 99) == fp
   and string.sub(value, 2, 2) == 'i'
   and (approved == '1'
        or (state == 'p' and tonumber(f[3]) > now_ms()))
then
    redis.call('SET', KEYS[1], string.sub(value, 1, 3) .. string.sub(v, 4, 35)
                               .. string.sub(value, 36), 'PX', ttl)
    return {'claimed'}
end

if state ~= 'i' or string.sub(v, 36, 99) ~= fp then
    return {'record', v}
end

local left = tonumber(f[2]) - (tonumber(f[3]) - redis.call('PTTL', KEYS[1]))

if left > 0 then
    if wait == '1' and string.sub(v, 3, 3) ~= '1' then
        v = '2i1' .. string.sub(v, 4)
        redis.call('SET', KEYS[1], v, 'KEEPTTL')
    end
    return {'in_progress', v, ms(left)}
end

-- The owner stopped renewing its lease: it may or may not have reached
-- the upstream, so the outcome is unknown, never free.
local u = '2u' .. string.sub(v, 3, 99) .. string.rep('-', 32)
          .. ns(f[1]) .. ns(ms(now_ms()))
redis.call('SET', KEYS[1], u, 'KEEPTTL')
announce(KEYS[1], v)
return {'record', u}
