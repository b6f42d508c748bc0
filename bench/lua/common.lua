-- Shared by the wrk scripts in bench/lua/ (loaded with dofile).
--
-- Every script is started as
--   wrk -t2 -c64 -d5s -s bench/lua/<script>.lua URL -- [arguments]
-- and prints exactly one machine-readable line at the end:
--   BENCH requests=N duration_us=N rps=F p50_us=N p90_us=N p99_us=N
--         errors=N non2xx=N
-- which bench/run parses.

local M = {}

-- A deterministic JSON document of exactly `size` bytes (size >= 64): an
-- order-like object with records whose members are not in sorted order,
-- floats, booleans, \u escapes, padded with a "note" string to the byte.
function M.json_body(size)
    local head = '{"batch_id":"b-0001","items":['
    local tail = '],"note":"'
    local close = '"}'
    local cur = #head + #tail + #close
    local recs = {}
    local i = 0

    while true do
        i = i + 1
        local rec = string.format(
            '{"sku":"SKU-%06d","qty":%d,"price":%d.%02d,"active":%s,' ..
            '"tags":["red","large"],"name":"Item %d \\u00e9t\\u00e9"}',
            i, i % 7 + 1, i % 500, i % 100,
            (i % 2 == 0) and "true" or "false", i)
        local add = #rec + ((i > 1) and 1 or 0)
        if cur + add > size then
            break
        end
        recs[#recs + 1] = rec
        cur = cur + add
    end

    return head .. table.concat(recs, ",") .. tail
           .. string.rep("x", size - cur) .. close
end

function M.headers(key)
    return {
        ["Content-Type"] = "application/json",
        ["Idempotency-Key"] = key,
    }
end

function M.done(summary, latency, requests)
    local e = summary.errors
    local secs = summary.duration / 1e6
    io.write(string.format(
        "BENCH requests=%d duration_us=%d rps=%.1f p50_us=%d p90_us=%d " ..
        "p99_us=%d errors=%d non2xx=%d\n",
        summary.requests, summary.duration, summary.requests / secs,
        latency:percentile(50), latency:percentile(90),
        latency:percentile(99),
        e.connect + e.read + e.write + e.timeout, e.status))
end

return M
