#!/usr/bin/env bash
# Load test of `keel serve` on loopback with wrk: sweeps the concurrency and prints req/s, infer/s (batch items),
# latency percentiles, errors by class, the server's average batch (inference count / execution count from
# /metrics), the mean model run a request waited for (run_ms: compare it with `keel bench`'s to tell the server's
# own cost from slower runs) and the server's CPU time per request (srv_cpu_ms, all its threads, from /proc: compare
# it with `keel bench`'s cpu_ms_per_run, which --bench prints, for what the server costs whatever the client on the
# same cores takes); optionally a soak at one concurrency with the server's resident memory sampled every second.
#   tools/serve_load.sh MODEL.onnx [--batching MAX_BATCH DELAY_US] [--dynamic-batch] [--instances N] [--binary]
#                       [--threads N] [--duration S] [--concurrency "1 2 4 8 16 32"] [--soak S] [--rows N]
#                       [--bench] [--passes SPEC]
#   --dynamic-batch   the model's fixed first dim of 1 becomes dynamic (config dynamic_batch = true)
#   --rows N          rows per request (the first dim; default 1)
#   --bench           first runs `keel bench` on the same model, threads, rows and instances (as concurrent runs):
#                     the in-process throughput and median
#   --soak S          after the sweep, S seconds at the last concurrency: RSS at 10 s and at the end, errors
# The model's first input is fed random data (dynamic dims = 1). Everything runs on 127.0.0.1, bounded in time.
set -euo pipefail
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
case ${1:-} in
  -h | --help) usage; exit 0 ;;
  "" | -*) usage >&2; exit 2 ;;
esac
[ -f "$1" ] || { echo "serve_load: no model file '$1'" >&2; exit 2; }
model=$(realpath "$1")  # before the cd below: a path relative to where the script was called from
shift
cd "$(dirname "$0")/.."
max_batch=0 delay=0 binary=0 threads=2 duration=5 conc="1 2 4 8 16 32" dynamic=0 instances=1 soak=0 rows=1 bench=0
passes=""
while (($#)); do
  case $1 in
    --batching) max_batch=$2 delay=$3; shift 3 ;;
    --dynamic-batch) dynamic=1; shift ;;
    --instances) instances=$2; shift 2 ;;
    --binary) binary=1; shift ;;
    --threads) threads=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    --soak) soak=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --bench) bench=1; shift ;;
    --passes) passes=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "serve_load: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
keel=${KEEL:-build/bin/keel}
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
if ((bench)); then
  shape_args=()
  ((rows > 1)) && shape_args=(--batch "$rows")
  timeout 300 "$keel" --log-level warn bench "$model" --threads "$threads" --concurrency "$instances" \
    "${shape_args[@]}" --warmup 5 -n 100000 --max-seconds "$duration" --json > "$work/bench.json"
  python3 - "$work/bench.json" <<'PY'
import json, sys
b = json.load(open(sys.argv[1]))
print("in-process keel bench: batch %d, threads %d, %d concurrent, %d runs: median %.3f ms, p90 %.3f ms, mean %.3f ms, "
      "%.1f inferences/s, %.3f ms of CPU per run" % (b["batch"], b["threads"], b["concurrency"], b["iters"], b["median_ms"],
                                                    b["p90_ms"], b["mean_ms"], b["throughput_per_s"], b["cpu_ms_per_run"]))
PY
fi
mkdir -p "$work/repo/m/1"
cp "$model" "$work/repo/m/1/model.onnx"
{
  ((max_batch > 0)) && printf 'max_batch_size = %d\nmax_queue_delay_us = %d\n' "$max_batch" "$delay"
  ((dynamic)) && printf 'dynamic_batch = true\n'
  ((max_batch > 0)) && printf 'warmup_batch_sizes = [%s]\n' "$(seq -s, 1 "$max_batch")"
  printf 'instances = %d\n' "$instances"
  [ -n "$passes" ] && printf 'passes = "%s"\n' "$passes"
  true
} > "$work/repo/m/config.toml"
"$keel" --log-level warn serve --model-repository "$work/repo" --port 0 --threads "$threads" --http-threads 64 \
  > "$work/stdout" 2> "$work/stderr" &
server=$!
for _ in $(seq 3000); do  # up to 300 s: warm-up builds a shape variant per batch size
  grep -q listening "$work/stdout" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$work/stderr" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/stdout")
[ -n "$port" ] || { echo "serve_load: the server did not start" >&2; exit 1; }
python3 - "$port" "$binary" "$work" "$rows" <<'PY'
import json, sys, urllib.request, struct, random
port, binary, work, rows = sys.argv[1], sys.argv[2] == "1", sys.argv[3], int(sys.argv[4])
meta = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/m", timeout=10))
inp = meta["inputs"][0]
shape = [1 if d < 0 else d for d in inp["shape"]]
if shape and inp["shape"][0] < 0:
    shape[0] = rows
n = 1
for d in shape: n *= d
fmt = {"FP32": "f", "FP64": "d", "INT64": "q", "INT32": "i", "UINT8": "B", "INT8": "b", "BOOL": "?"}[inp["datatype"]]
vals = [random.random() if fmt in "fd" else (random.random() < .5 if fmt == "?" else random.randint(0, 9)) for _ in range(n)]
if binary:
    raw = struct.pack("<%d%s" % (n, fmt), *vals)
    head = json.dumps({"inputs": [{"name": inp["name"], "datatype": inp["datatype"], "shape": shape,
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}).encode()
    body, hl = head + raw, len(head)
else:
    body, hl = json.dumps({"inputs": [{"name": inp["name"], "datatype": inp["datatype"], "shape": shape,
                                       "data": vals}]}).encode(), None
open(f"{work}/body", "wb").write(body)
with open(f"{work}/post.lua", "w") as f:
    f.write('wrk.method = "POST"\n')
    f.write(f'local fh = io.open("{work}/body", "rb")\nwrk.body = fh:read("*a")\nfh:close()\n')
    f.write('wrk.headers["Content-Type"] = "application/json"\n')
    if hl is not None:
        f.write(f'wrk.headers["Inference-Header-Content-Length"] = "{hl}"\n')
PY
metric() { curl -s --max-time 10 "http://127.0.0.1:$port/metrics" | sed -n "s/^$1{model=\"m\",version=\"1\"} //p"; }
rss_kib() { awk '/^VmRSS/ {print $2}' "/proc/$server/status"; }
# The server's CPU time so far (user + system, every thread) in clock ticks: fields 14 and 15 of /proc/PID/stat,
# counted after the command name (which may hold spaces) ends with ')'.
cpu_ticks() { sed 's/.*) //' "/proc/$server/stat" | awk '{print $12 + $13}'; }
clk_tck=$(getconf CLK_TCK)
# One wrk run: prints the row of the table (and leaves wrk's output in $work/wrk.txt).
run_wrk() {
  local c=$1 secs=$2
  local i0 e0 i1 e1 q0 q1 u0 u1 t0 t1
  i0=$(metric keel_inference_count) e0=$(metric keel_inference_exec_count)
  q0=$(metric keel_inference_request_success) u0=$(metric keel_inference_compute_infer_duration_us)
  t0=$(cpu_ticks)
  timeout $((secs + 30)) wrk -t "$(( c < 2 ? 1 : 2 ))" -c "$c" -d "${secs}s" --timeout 30s --latency \
    -s "$work/post.lua" "http://127.0.0.1:$port/v2/models/m/infer" > "$work/wrk.txt"
  t1=$(cpu_ticks)
  i1=$(metric keel_inference_count) e1=$(metric keel_inference_exec_count)
  q1=$(metric keel_inference_request_success) u1=$(metric keel_inference_compute_infer_duration_us)
  local out rps ips non2xx sock batch run cpu
  out=$(cat "$work/wrk.txt")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  ips=$(awk -v a=$((i1 - i0)) -v s="$secs" 'BEGIN {printf "%.1f", a / s}')
  ms() { awk -v p="$1" '$1 == p {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.3f", v}' <<<"$out"; }
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  # wrk: "Socket errors: connect 0, read 0, write 0, timeout 0"
  sock=$(awk '/Socket errors/ {gsub(",", ""); printf "c%s/r%s/w%s/t%s", $4, $6, $8, $10}' <<<"$out")
  batch=$(awk -v a=$((i1 - i0)) -v b=$((e1 - e0)) 'BEGIN {printf "%.2f", b ? a / b : 0}')
  # The model's run time per execution (the server counts a batch's run once per request in it).
  run=$(awk -v u=$((u1 - u0)) -v q=$((q1 - q0)) -v b="$batch" 'BEGIN {printf "%.3f", q ? u / q / 1000 : 0}')
  # The server's CPU time per request answered (the /metrics scrapes around the run add a few ms in all).
  cpu=$(awk -v t=$((t1 - t0)) -v hz="$clk_tck" -v q=$((q1 - q0)) 'BEGIN {printf "%.3f", q ? t * 1000 / hz / q : 0}')
  printf '%-5s %10s %10s %9s %9s %9s %8s %14s %9s %8s %10s\n' "$c" "$rps" "$ips" "$(ms 50%)" "$(ms 90%)" "$(ms 99%)" \
    "${non2xx:-0}" "${sock:-0}" "$batch" "$run" "$cpu"
}
printf '%-5s %10s %10s %9s %9s %9s %8s %14s %9s %8s %10s\n' conc req/s infer/s p50_ms p90_ms p99_ms non2xx sock_c/r/w/t \
  avg_batch run_ms srv_cpu_ms
last=1
for c in $conc; do
  run_wrk "$c" "$duration"
  last=$c
done
if ((soak > 0)); then
  echo "soak: ${soak}s at concurrency $last; server RSS sampled every second"
  rss0=$(rss_kib)
  ( for _ in $(seq "$soak"); do sleep 1; rss_kib; done > "$work/rss.txt" ) &
  sampler=$!
  run_wrk "$last" "$soak"
  wait "$sampler" || true
  awk -v r0="$rss0" '{v[NR] = $1} END {
      at10 = v[10 < NR ? 10 : NR]; mx = 0; for (i = 10; i <= NR; i++) if (v[i] > mx) mx = v[i];
      printf "rss_kib: before %d, at 10 s %d, max after 10 s %d, at the end %d, growth after 10 s %+d KiB (%+.2f%%)\n",
             r0, at10, mx, v[NR], v[NR] - at10, 100 * (v[NR] - at10) / at10 }' "$work/rss.txt"
  echo "rss_kib every 10 s: $(awk 'NR % 10 == 0 {printf "%s ", $1}' "$work/rss.txt")"
  curl -s --max-time 10 "http://127.0.0.1:$port/metrics" | grep -E '^keel_inference_request_(success|failure)|^keel_http_responses' || true
fi
