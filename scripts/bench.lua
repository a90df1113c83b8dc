-- wrk script for `make bench`. With $BENCH_REQUESTS (one "signature<TAB>body"
-- per line) it replays pre-signed POSTs, each wrk thread taking every n-th
-- line so that no two threads send the same request; without it, wrk sends
-- its plain GET (GET /health). With $BENCH_DELAY_MS, each connection waits
-- that long before each request (a paced load at a fixed offered rate), the
-- first wait drawn at random in [0, delay] so that the connections do not
-- fire in step. Prints one JSON summary for scripts/bench.py.

local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(os.time() + tid)
  started = 0
  if not os.getenv("BENCH_REQUESTS") then return end
  local lines = {}
  for line in io.lines(os.getenv("BENCH_REQUESTS")) do
    lines[#lines + 1] = line
  end
  requests = {}
  local step = tonumber(os.getenv("BENCH_THREADS") or "2")
  -- The stripe scheme's header (the fetch scenario): Stripe-Signature, t=<unix>,v1= before the hex.
  local header = os.getenv("BENCH_SIGNATURE_HEADER") or "X-Signature"
  local prefix = os.getenv("BENCH_SIGNATURE_PREFIX") or ""
  for i = tid + 1, #lines, step do
    local sig, body = lines[i]:match("^(%x+)\t(.*)$")
    requests[#requests + 1] = wrk.format("POST", nil,
      {["Content-Type"] = "application/json", [header] = prefix .. sig}, body)
  end
  index = 0
end

if os.getenv("BENCH_REQUESTS") then
  function request()
    index = index + 1
    if index > #requests then index = 1 end
    return requests[index]
  end
end

local delay_ms = tonumber(os.getenv("BENCH_DELAY_MS") or "")
local connections = tonumber(os.getenv("BENCH_CONNECTIONS_PER_THREAD") or "0")
if delay_ms then
  function delay()
    -- The first call of each connection comes before any answer: stagger them.
    if started < connections then
      started = started + 1
      return math.random(0, math.floor(delay_ms))
    end
    return delay_ms
  end
end

function done(summary, latency, requests)
  local seconds = summary.duration / 1e6
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "rps": %.1f, "p50": %.2f, "p90": %.2f, "p99": %.2f, "non2xx": %d, "errors": %d}\n',
    summary.requests, summary.requests / seconds,
    latency:percentile(50) / 1000, latency:percentile(90) / 1000, latency:percentile(99) / 1000,
    e.status, e.connect + e.read + e.write + e.timeout))
end
