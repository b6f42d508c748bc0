-- idempotency_audit with the stream: the completions a worker has to
-- write in one turn of its event loop, in one script and one stream
-- entry (docs/audit.md, "Completions share an entry").  complete.lua
-- with the audit costs Redis a script call, six arguments, a head check
-- and an XADD per first write; here they are paid once per turn.
--
--: needs audit
--: args
--
-- KEYS[1..n]  the records, n = #KEYS - 2 (2 to 16)
-- KEYS[n+1]   the stream
-- KEYS[n+2]   its head key (audit.lua)
-- ARGV[1..6]  audit.lua's arguments: one entry, the events of all n
--             completions ("accepted", "completed" of each, in order)
-- ARGV[3i+4], ARGV[3i+5], ARGV[3i+6]
--             record i's owner, value and ttl (complete.lua's)
--
-- The change and the entry are all or nothing, as with complete.lua: a
-- record its owner no longer holds (its lease lapsed, an operator
-- resolved it) stops the whole script before it writes, and the module
-- sends the others again with an entry of their events alone.
--
-- Replies: 1, every record completed and the entry appended;
-- {"lost", i, ...}: the records (from 1) their owners no longer hold,
-- nothing written; else audit.lua's "audit-head", nothing written.

local n = #KEYS - 2
local v, lost = {}, nil

for i = 1, n do
    v[i] = redis.call('GET', KEYS[i])
    if not owned(v[i], ARGV[3 * i + 4]) then
        lost = lost or {'lost'}
        lost[#lost + 1] = i
    end
end

if lost then
    return lost
end

local stop = audit_gate(nargs + 1, KEYS[n + 1])

if stop then
    return stop
end

for i = 1, n do
    announce(KEYS[i], v[i])
    redis.call('SET', KEYS[i], ARGV[3 * i + 5], 'PX', ARGV[3 * i + 6])
end

return 1
