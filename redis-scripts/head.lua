-- The record's head (layout 2, docs/states.md), read and written only
-- through what this file defines: the layout, the state, the waiters
-- flag, the operation id, the fingerprint and the owner token, then the
-- netstring fields.  config fills each @...@ from idem_record.h (offsets
-- there count from 0, Lua's string.sub from 1: config writes the first and
-- last position of each field as Lua counts), so the C core and the
-- scripts share one definition of the offsets; t/02-tree.t refuses a bare
-- offset into a value anywhere else.
--
-- The readers are inlined by config, not called: a "--: head" line below
-- defines NAME(V) (or NAME(V, S)) as the expression after it, and config
-- writes that expression, with the call's arguments, in place of each
-- call in every script.  Each local function a script defines is a
-- closure made again on every call of the script: a dozen of them cost
-- about a third of a fenced completion's own time in Redis.  An argument
-- is a plain name (V) or a quoted state letter (S); config refuses a
-- script that calls one with anything else.
--
--: head is_layout2(V) (string.sub(V, @LAYOUT_AT@, @LAYOUT_AT@) == '@IDEM_LAYOUT@')
--: head state_of(V)   string.sub(V, @STATE_AT@, @STATE_AT@)
--: head waiters_of(V) string.sub(V, @WAITERS_AT@, @WAITERS_AT@)
--: head op_of(V)      string.sub(V, @OP_AT@, @OP_END@)
--: head fp_of(V)      string.sub(V, @FP_AT@, @FP_END@)
--: head owner_of(V)   string.sub(V, @OWNER_AT@, @OWNER_END@)
--: head head_of(V)    string.sub(V, 1, @IDEM_HEAD_LEN@)
--: head fields_of(V)  string.sub(V, @FIELDS_AT@)
--: head in_state(V, S) (string.sub(V, @LAYOUT_AT@, @STATE_AT@) == '@IDEM_LAYOUT@S')
--
-- is_layout2: a value of the layout the scripts read and write (layout 1
-- was a hash); waiters_of: "1" once a duplicate waits for the record
-- (idempotency_wait); owner_of: the claiming attempt's token, or 32 '-';
-- head_of, fields_of: the whole head, and what follows it;
-- in_state(v, 'i'): v is of layout 2 and in that state.

-- the head's length: the fields start after it
local head_len = @IDEM_HEAD_LEN@

-- A head from its fields, in the order of idem_record.h (config checks
-- that the offsets there are this order, each field after the last); an
-- owner nil is the owner of a record no attempt owns (every state but
-- in_progress).
local function make_head(state, waiters, op, fp, owner)
    return '@IDEM_LAYOUT@' .. state .. waiters .. op .. fp
           .. (owner or string.rep('-', @IDEM_TOKEN_LEN@))
end
