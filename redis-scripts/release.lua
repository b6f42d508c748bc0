-- Forget a claim whose request never reached the upstream, so that a retry
-- executes.  Fenced by the owner token.
--
-- KEYS[1]  record key
-- ARGV[1]  owner token
--
-- Reply: 1 when released, 0 when the claim was not ours any more.

local r = redis.call('HMGET', KEYS[1], 'state', 'owner', 'waiters')

if r[1] ~= 'in_progress' or r[2] ~= ARGV[1] then
    return 0
end

-- Somebody waits for this record (idempotency_wait): tell them it changed.
if r[3] then
    redis.call('PUBLISH', 'idem:done', KEYS[1])
end

redis.call('DEL', KEYS[1])

return 1
