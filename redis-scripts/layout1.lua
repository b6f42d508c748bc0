-- Records of layout 1, a hash per record, written by module versions
-- before layout 2, stay readable until their TTL ends: claims replay and
-- refuse them as before, and the status and admin endpoints show and
-- resolve them.  They are answered as layout-2 values, so the module has
-- one decoder.  docs/states.md says what an upgrade does with records in
-- flight.

local layout1_states = { in_progress = 'i', completed = 'c', unknown = 'u' }

-- {v, state, fp, op, lease, created, completed, status, hdr, body, stored,
--  unknown_at, resolved, waiters, owner}, or nil when it is not a record
local function layout1_read(key)
    if redis.call('TYPE', key).ok ~= 'hash' then
        return nil
    end
    local r = redis.call('HMGET', key, 'v', 'state', 'fp', 'op', 'lease',
                         'created', 'completed', 'status', 'hdr', 'body',
                         'stored', 'unknown_at', 'resolved', 'waiters',
                         'owner')
    if r[1] ~= '1' or not layout1_states[r[2] or ''] or not r[3]
       or not r[4] then
        return nil
    end
    return r
end

-- the record as layout 2 would hold it; "left" is a claim's lease left
local function layout1_value(r, left)
    local st = layout1_states[r[2]]
    local owner
    if st == 'i' then
        owner = r[15]
    end
    local v = make_head(st, r[14] and '1' or '0', r[4], r[3], owner)
    if st == 'c' then
        return v .. ns(r[6] or '0') .. ns(r[7] or '0') .. ns(r[8] or '')
                 .. ns(r[11] or '0') .. ns(r[13] or '0') .. ns(r[9] or '')
                 .. ns(r[10] or '')
    end
    if st == 'u' then
        return v .. ns(r[6] or '0') .. ns(r[12] or r[6] or '0')
    end
    left = ms(math.max(left or 1, 1))
    return v .. ns(r[6] or '0') .. ns(left) .. ns(left)
end

local function layout1_lapsed(r, now)
    return r[2] == 'in_progress' and tonumber(r[5] or '0') <= now
end
