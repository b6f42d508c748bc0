-- Read one record for the status endpoint.  Read-only: a lapsed lease is
-- reported as "unknown" here and converted by the next claim.
--
--: args
--
-- KEYS[1]  record key
--
-- Replies: {} when there is no record, else
--   {state, fingerprint, op, created, completed, status}

local now = now_ms()

local r = redis.call('HMGET', KEYS[1], 'v', 'state', 'fp', 'op', 'created',
                     'completed', 'status', 'lease')

if not r[2] then
    return {}
end

if r[1] ~= '1' or not r[3] or not r[4] then
    return corrupt('layout')
end

local state = r[2]

if state == 'in_progress' and tonumber(r[8] or '0') <= now then
    state = 'unknown'
end

return {state, r[3], r[4], r[5] or '', r[6] or '', r[7] or ''}
