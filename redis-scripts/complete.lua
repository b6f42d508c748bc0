-- Record the upstream's final response, if this attempt still owns the claim.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  status
-- ARGV[3]  stored headers (netstrings)
-- ARGV[4]  body ("" when not stored)
-- ARGV[5]  "1" when the body is stored, "0" when it was too large
-- ARGV[6]  retention TTL in seconds
--
-- Reply: 1 when recorded, 0 when the claim was lost (lease lapsed, resolved).

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

redis.call('HSET', KEYS[1],
           'state', 'completed', 'status', ARGV[2], 'hdr', ARGV[3],
           'body', ARGV[4], 'stored', ARGV[5], 'completed', string.format('%d', now))
redis.call('HDEL', KEYS[1], 'owner', 'lease')
redis.call('EXPIRE', KEYS[1], ARGV[6])

return 1
