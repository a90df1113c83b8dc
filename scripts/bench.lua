-- wrk script for `make bench`: replays pre-signed requests from
-- $BENCH_REQUESTS (one "signature<TAB>body" per line), each wrk thread taking
-- every n-th line so that no two threads send the same request, then prints
-- one JSON summary for scripts/bench.py.

local threads = {}
local counter = 0

function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
  table.insert(threads, thread)
end

function init(args)
  local lines = {}
  for line in io.lines(os.getenv("BENCH_REQUESTS")) do
    lines[#lines + 1] = line
  end
  requests = {}
  local step = tonumber(os.getenv("BENCH_THREADS") or "2")
  for i = tid + 1, #lines, step do
    local sig, body = lines[i]:match("^(%x+)\t(.*)$")
    requests[#requests + 1] = wrk.format("POST", nil,
      {["Content-Type"] = "application/json", ["X-Signature"] = sig}, body)
  end
  index = 0
end

function request()
  index = index + 1
  if index > #requests then index = 1 end
  return requests[index]
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
