-- bench/webhook_load.py run_wrk: POST the AdmissionReview in the file args[1] on every
-- connection, each thread stopping after args[2] answers; every answer checked (200 and a
-- patch); done() prints one JSON line (latencies in microseconds).
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args)
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  local f = io.open(args[1], "rb"); wrk.body = f:read("*a"); f:close()
  limit = tonumber(args[2]); answered = 0; bad = 0
end
function response(status, headers, body)
  answered = answered + 1
  if status ~= 200 or not string.find(body, '"patchType"', 1, true) then bad = bad + 1 end
  if answered == limit then  -- wrk runs its -d whatever its threads do: the bench sends SIGINT
    io.write("stopped\n"); io.stdout:flush(); wrk.thread:stop()
  end
end
function done(summary, latency, requests)
  local bad_total = 0
  for _, t in ipairs(threads) do bad_total = bad_total + t:get("bad") end
  io.write(string.format('{"requests": %d, "duration_us": %d, "p50_us": %d, "p99_us": %d, "max_us": %d, "mean_us": %.1f, "bad": %d, "errors": %d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99), latency.max, latency.mean, bad_total,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))
end
