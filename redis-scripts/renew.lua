-- Extend the lease of a claim while its request is alive.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
-- ARGV[2]  lease in milliseconds
--
-- Reply: 1 when extended, 0 when the claim was not ours any more.

local r = redis.call('HMGET', KEYS[1], 'state', 'owner')

if r[1] ~= 'in_progress' or r[2] ~= ARGV[1] then
    return 0
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

redis.call('HSET', KEYS[1], 'lease', string.format('%d', now + tonumber(ARGV[2])))

return 1
