-- First writes: a new Idempotency-Key on every request, POST with a JSON
-- body of SIZE bytes (default 300).
--   wrk ... -s bench/lua/firstwrite.lua URL -- PREFIX [SIZE]
-- Keys are PREFIX-<thread>-<counter>; bench/run makes PREFIX unique per
-- run and round, so no two requests of any run share a key.

local dir = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
local common = dofile(dir .. "common.lua")

local threads = 0

function setup(thread)
    threads = threads + 1
    thread:set("tid", threads)
end

local prefix, body, n, path

function init(args)
    prefix = (args[1] or "fw") .. "-" .. tostring(tid)
    body = common.json_body(tonumber(args[2] or "300"))
    path = wrk.path
    n = 0
end

function request()
    n = n + 1
    return wrk.format("POST", path, common.headers(prefix .. "-" .. n), body)
end

done = common.done
