-- The request was sent but no complete response came back: the upstream may
-- have acted.  Keep the record as "unknown" so nothing re-executes it.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
--
-- Reply: 1 when marked, 0 when the claim was not ours any more.

local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'waiters')

if r[1] ~= 'in_progress' or r[2] ~= ARGV[1] then
    return 0
end

-- Somebody waits for this record (idempotency_wait): tell them it changed.
if r[3] then
    redis.call('PUBLISH', 'idem:done', KEYS[1])
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('HSET', KEYS[1], 'state', 'unknown', 'unknown_at', string.format('%d', now))
redis.call('HDEL', KEYS[1], 'owner', 'lease')

return 1
