-- Reading whole records: their fields, Redis's clock, and what a claim's
-- age is (for the scripts that decide about leases or rewrite a record).

local function now_ms()
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function ns(s)
    return string.format('%d:', #s) .. s .. ','
end

-- the netstring fields after the head, as strings, or nil unless they are
-- exactly as the module writes them (decimal lengths without leading
-- zeros, each field closed by its comma, nothing after the last)
local function fields(v)
    local out, pos = {}, head_len + 1
    while pos <= #v do
        local len = string.match(v, '^(0):', pos) or string.match(v, '^([1-9]%d*):', pos)
        if not len or #len > 18 then
            return nil
        end
        local n = tonumber(len)
        local at = pos + #len + 1
        if string.sub(v, at + n, at + n) ~= ',' then
            return nil
        end
        out[#out + 1] = string.sub(v, at, at + n - 1)
        pos = at + n + 1
    end
    return out
end

local function corrupt(what)
    return redis.error_reply('IDEMCORRUPT record has an unknown ' .. what)
end

-- the number of fields each state has (see idem_record.h)
local field_count = { i = 3, c = 7, u = 2, r = 2, a = 2, p = 4, s = 2,
                      d = 4 }

-- A string record of layout 2, or nil: anything else under our key is
-- somebody else's (or damaged), and never written into.
local function layout2(v)
    if not is_layout2(v) or #v < head_len then
        return nil
    end
    local f = fields(v)
    local state = state_of(v)
    if not f or #f ~= field_count[state] then
        return nil
    end
    -- the lease arithmetic of the scripts reads these two
    if state == 'i' and not (string.match(f[2], '^[1-9]%d*$')
                             and string.match(f[3], '^[1-9]%d*$')) then
        return nil
    end
    return f
end

-- A value the scripts may read: its fields and its state, or nil and the
-- error reply that refuses it.
local function readable(v)
    local f = layout2(v)
    if not f then
        return nil, corrupt('layout')
    end
    return f, state_of(v)
end

-- Record v of key as it stands: a claim whose owner wrote its completion
-- beside it (prelude.lua) is that completion.  With fold, the completion
-- takes the record's place (with the rest of its TTL), once per key, so
-- that the next look is one native command again; a Redis too full to
-- fold (OOM) still answers with it, and the next look folds.
local function settled(key, v, fold)
    local c = done_of(key, v)
    if not c then
        return v
    end
    if fold then
        local dk = done_key(key, v)
        local left = redis.call('PTTL', dk)
        local ok
        if left > 0 then
            ok = redis.pcall('SET', key, c, 'PX', left)
        else
            ok = redis.pcall('SET', key, c, 'KEEPTTL')
        end
        if type(ok) == 'table' and ok.ok then
            redis.call('DEL', dk)
        end
        -- the owner announced it unless its answer was lost: once more
        if waiters_of(v) == '1' then
            publish(key)
        end
    end
    return c
end

-- readable() of record v of key as it stands (settled, and folded with
-- fold): its fields, its state (or nil and the error reply) and its value
local function readable_settled(key, v, fold)
    local f, state = readable(v)
    if f and state == 'i' then
        local c = settled(key, v, fold)
        if c ~= v then
            v = c
            f, state = readable(v)
        end
    end
    return f, state, v
end

-- The lease a claim has left, by Redis's clock: the claim and each
-- renewal set its TTL to its "ttl ms" field (the third), and the lease is
-- the second.
local function lease_left(key, f)
    return tonumber(f[2]) - (tonumber(f[3]) - redis.call('PTTL', key))
end

local function lapsed(key, f)
    return lease_left(key, f) <= 0
end

-- A unique or lock key's value (idempotency_unique, _lock) names the
-- operation that took it: its record key, its operation id and, for a
-- lock, a tag of its scope.  The record key alone would not do: the key
-- may hold another operation since (released, then claimed again with
-- another request), which must not inherit an identity or a lock.
local function named(h, klen)
    return string.sub(h, 1, klen), string.sub(h, klen + 1, klen + 32),
           string.sub(h, klen + 33)
end

-- Operation op under record key rk, as an identity, an alias or a lock
-- sees it: 'i' with its lease left, 'lapsed' (its owner stopped renewing:
-- unknown), 'u', or 'c' of a 2xx, with its value and fields; nil when it
-- holds nothing (another operation under the key, a non-2xx, a proposal,
-- a marker, no record).
local function holds(rk, op)
    local v = redis.pcall('GET', rk)
    if type(v) ~= 'string' or op_of(v) ~= op then
        return nil
    end
    local f, s
    f, s, v = readable_settled(rk, v)
    if not f then
        return nil
    end
    if s == 'i' then
        local left = lease_left(rk, f)
        if left > 0 then
            return 'i', v, f, left
        end
        return 'lapsed', v, f
    end
    if s == 'u' or (s == 'c' and string.find(f[3], '^2')) then
        return s, v, f
    end
    return nil
end
