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
--   seq     the entry's sequence number (its stream ID is "<seq>-0");
--           "0" when the entries go to the audit file only: they are not
--           sent, nothing is appended, and the reply says "audited" all
--           the same
--   head    the stream's head the entry is chained on: "<seq>:<hash>",
--           the last entry's sequence number and its h ("0:" and 32 zero
--           bytes for an empty stream)
--   time    the entry's time (ms), or "" (not checked): Redis refuses one
--           more than 2 s away from its own clock
--   then the entry, when there is one: its hash (the raw digest) and its
--   encoding (the step's events, docs/audit.md), appended as
--   XADD <stream> <seq>-0 h <hash> e <encoding>
--
-- The stream's head is kept in a key of its own, the last key of the
-- script (<stream>:head, "<seq>:<hash>" of the last entry this module
-- appended), so that the check reads 40 bytes instead of the stream's last
-- entry: the head key must say what the worker expects (SET ... GET moves
-- it on and says what it held, put back when the entry does not go in)
-- and XADD must accept the ID (greater than the stream's last one).  When either fails
-- (another writer was first, the head key is missing or was written by
-- nobody but an older module, entries were added by hand), the stream
-- itself says where its head is, as before the head key: its last entry,
-- after the last ID it ever had.  So the module chains on the head it
-- appended even when the newest entries were deleted since (XDEL, or the
-- stream rebuilt without them): the gap stays in the stream for verify.
--
-- Replies, instead of the script's own:
--   {"audit-head", seq, hash, time}: the stream's last entry is not the
--       one expected (or the time is off); nothing was written
--   {"audit-decide", want, kind, basis, reply}: the script decided
--       something the entries were not made for; nothing was written;
--       the module makes the entries of "want" and calls it again
--   {"audited", reply}: the entries were appended with the change; the
--       fenced scripts (complete, release, fail) and claimnew.lua answer
--       1 instead, which only they answer once the change and the entries
--       are made

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
    local id = ARGV[at + 1]
    if id == '0' then
        audit_appended = true
        return nil
    end
    if not ARGV[at + 5] then
        return nil
    end
    local hk, head, late = KEYS[#KEYS], ARGV[at + 2], false
    local now = 0
    if ARGV[at + 3] ~= '' then
        local t = redis.call('TIME')
        now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        late = math.abs(now - tonumber(ARGV[at + 3])) > 2000
    end
    -- The head key is checked and moved on in one call (SET ... GET: a
    -- GET then a SET were one redis.call more per entry), and put back as
    -- it was when the entry does not go in.  The XADD is the script's
    -- first write of the stream: nothing is written there before it and,
    -- when it fails, nothing at all (a script that wrote its change first
    -- gives it back: claimnew.lua).
    local mine, was, swapped = id .. ':' .. ARGV[at + 4], false, false
    if not late
       and tonumber(id) == (tonumber(string.match(head, '^%d+')) or -1) + 1
    then
        was, swapped = redis.call('SET', hk, mine, 'GET'), true
    end
    if was ~= head
       or type(redis.pcall('XADD', stream, id, 'h', ARGV[at + 4],
                           'e', ARGV[at + 5])) ~= 'string' then
        if swapped and was then
            redis.call('SET', hk, was)
        elseif swapped then
            redis.call('DEL', hk)
        end
        local top = redis.call('XREVRANGE', stream, '+', '-', 'COUNT', 1)[1]
        local seq, hash = 0, string.rep('\0', 32)
        if top then
            seq = tonumber(string.match(top[1], '^%d+'))
            hash = top[2][1] == 'h' and top[2][2] or ''
        end
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
        last = math.max(seq, last)
        if now == 0 then
            local t = redis.call('TIME')
            now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        end
        if late or tonumber(id) ~= last + 1 or ms(last) .. ':' .. hash ~= head
        then
            return {'audit-head', ms(last), hash, ms(now)}
        end
        redis.call('XADD', stream, id, 'h', ARGV[at + 4], 'e', ARGV[at + 5])
        redis.call('SET', hk, mine)
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
