-- idempotency_audit (docs/audit.md): the entries of a state change go into
-- the audit stream in the same script as the change, or neither does.
-- The module hashes each entry in C (Lua has no SHA-256) against the head
-- it expects, so the script checks that head (compare-and-swap) before it
-- writes anything; a script that loses the race writes nothing and tells
-- the module the real head, and the module hashes again.
--
-- Without idempotency_audit the scripts get no audit arguments and this
-- does nothing.  With it, ARGV from index `at` (after the script's own
-- arguments) holds:
--
--   expect  "" for a fenced script (its owner token is its condition);
--           for claim.lua and admin.lua the decision the entries were
--           made for: "claim", or "<kind>:<head of the record decided on>"
--   seq     the first entry's sequence number; "0" when the entries go
--           to the audit file only: they are not sent, nothing is
--           appended, and the reply says "audited" all the same
--   prev    the hash the stream's last entry must have
--           (64 '0' for an empty stream)
--   time    the entries' time (ms): Redis refuses one more than 2 s away
--           from its own clock
--   then one pair per entry: its hash and its encoding, appended as
--   XADD <stream> <seq>-0 h <hash> e <encoding>
--
-- Replies, instead of the script's own:
--   {"audit-head", seq, hash, time}: the stream's last entry is not the
--       one expected (or the time is off); nothing was written
--   {"audit-decide", want, kind, basis, reply}: the script decided
--       something the entries were not made for; nothing was written;
--       the module makes the entries of "want" and calls it again
--   {"audited", reply}: the entries were appended with the change

-- Every script that changes a record runs this file's text on each call,
-- with or without the audit, so it defines as little as it can: two
-- functions, nothing from fields.lua (a script without the audit pays for
-- each closure made).

local audit_appended = false

-- nil to go on; else the reply that ends the script before it writes
local function audit_gate(at, stream, kind, basis, reply)
    local expect = ARGV[at]
    if not stream or not expect then
        return nil
    end
    if expect ~= '' then
        -- the decision: its kind and the part of the record's head that
        -- names it (state, operation, fingerprint, owner; not the waiters)
        local want = kind
        if kind ~= 'claim' then
            want = kind .. ':' .. (basis and state_of(basis) .. op_of(basis)
                                             .. fp_of(basis)
                                             .. owner_of(basis)
                                   or '')
        end
        if want ~= expect then
            return {'audit-decide', want, kind, basis or '', reply}
        end
    end
    -- seq "0": the audit file alone (idempotency_audit file=), which the
    -- module writes once this script has made the change; nothing here
    if ARGV[at + 1] == '0' then
        audit_appended = true
        return nil
    end
    if not ARGV[at + 4] then
        return nil
    end
    local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
    local seq, hash = 0, string.rep('0', 64)
    if top then
        seq = tonumber(string.match(top[1], '^%d+'))
        hash = top[2][1] == 'h' and top[2][2] or ''
    end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local want = tonumber(ARGV[at + 1])
    if want ~= seq + 1 or hash ~= ARGV[at + 2]
       or math.abs(now - tonumber(ARGV[at + 3])) > 2000 then
        -- Entries deleted after the last one (XDEL) leave the stream's
        -- last ID past it: the next entries go after that ID, chained on
        -- the last entry there is, so that the gap stays in the stream.
        local last = seq
        if top or redis.call('EXISTS', stream) == 1 then
            local info = redis.call('XINFO', 'STREAM', stream)
            for i = 1, #info, 2 do
                if info[i] == 'last-generated-id' then
                    last = tonumber(string.match(info[i + 1], '^%d+'))
                end
            end
        end
        if last <= seq or want ~= last + 1 or hash ~= ARGV[at + 2]
           or math.abs(now - tonumber(ARGV[at + 3])) > 2000 then
            return {'audit-head', ms(math.max(seq, last)), hash, ms(now)}
        end
        seq = last
    end
    for i = at + 4, #ARGV, 2 do
        seq = seq + 1
        redis.call('XADD', stream, ms(seq) .. '-0', 'h', ARGV[i],
                   'e', ARGV[i + 1])
    end
    audit_appended = true
    return nil
end

local function audit_done(reply)
    if audit_appended then
        return {'audited', reply}
    end
    return reply
end
