-- Replays: the same NKEYS (default 100) keys, stored beforehand by
-- bench/run with the same body, requested round-robin.
--   wrk ... -s bench/lua/replay.lua URL -- PREFIX [NKEYS] [SIZE]
-- Keys are PREFIX-<i> for i = 1..NKEYS.  Against the plain proxy_pass
-- server the very same requests simply go to the upstream.

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end

local reqs, i

function init(args)
    local prefix = args[1] or "rp"
    local nkeys = tonumber(args[2] or "100")
    local body = common.json_body(tonumber(args[3] or "300"))
    -- pre-built: a replay request costs the client nothing but a send
    reqs = {}
    for k = 1, nkeys do
        reqs[k] = wrk.format("POST", wrk.path,
                             common.headers(prefix .. "-" .. k), body)
    end
    -- threads start at different keys
    i = (tid * 37) % nkeys
end

function request()
    i = i % #reqs + 1
    return reqs[i]
end

done = common.done
