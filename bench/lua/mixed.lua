-- Mixed traffic for the memory test: every other request is a first write
-- (a new key WPREFIX-m<thread>-<counter>), the others replay one of the
-- NKEYS keys RPREFIX-1..NKEYS stored beforehand.  Each thread stops after
-- LIMIT responses and then creates the file STOPFILE.<tid>, so that
-- bench/run can end wrk after an exact number of requests.
--   wrk ... -s bench/lua/mixed.lua URL -- RPREFIX NKEYS LIMIT STOPFILE WPREFIX [SIZE]

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end

local prefix, replays, body, n, got, limit, stopfile, path

function init(args)
    local nkeys = tonumber(args[2] or "100")
    local size = tonumber(args[6] or "300")
    prefix = (args[5] or args[1]) .. "-m" .. tostring(tid)
    limit = tonumber(args[3] or "0")
    stopfile = args[4]
    body = common.json_body(size)
    path = wrk.path
    replays = {}
    for k = 1, nkeys do
        replays[k] = wrk.format("POST", path,
                                common.headers(args[1] .. "-" .. k), body)
    end
    n = 0
    got = 0
end

function request()
    n = n + 1
    if n % 2 == 0 then
        return replays[(n / 2) % #replays + 1]
    end
    return wrk.format("POST", path, common.headers(prefix .. "-" .. n), body)
end

function response(status, headers, body)
    got = got + 1
    if limit > 0 and got == limit then
        local f = io.open(stopfile .. "." .. tostring(tid), "w")
        if f then f:close() end
        wrk.thread:stop()
    end
end

done = common.done
