#!/usr/bin/env bash
# Load test of `keel serve` on loopback with wrk: sweeps the concurrency and prints req/s, latency percentiles,
# non-2xx responses and the server's average batch (inference count / execution count from /metrics).
#   tools/serve_load.sh MODEL.onnx [--batching MAX_BATCH DELAY_US] [--binary] [--threads N] [--duration S]
#                       [--concurrency "1 2 4 8 16 32"]
# The model's first input is fed random data (dynamic dims = 1). Everything runs on 127.0.0.1, bounded in time.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: tools/serve_load.sh MODEL.onnx [options]}
shift
max_batch=0 delay=0 binary=0 threads=2 duration=5 conc="1 2 4 8 16 32"
while (($#)); do
  case $1 in
    --batching) max_batch=$2 delay=$3; shift 3 ;;
    --binary) binary=1; shift ;;
    --threads) threads=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --concurrency) conc=$2; shift 2 ;;
    *) echo "serve_load: unknown option $1" >&2; exit 2 ;;
  esac
done
keel=${KEEL:-build/bin/keel}
work=$(mktemp -d)
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/repo/m/1"
cp "$model" "$work/repo/m/1/model.onnx"
if ((max_batch > 0)); then
  printf 'max_batch_size = %d\nmax_queue_delay_us = %d\n' "$max_batch" "$delay" > "$work/repo/m/config.toml"
fi
"$keel" --log-level warn serve --model-repository "$work/repo" --port 0 --threads "$threads" --http-threads 64 \
  > "$work/stdout" 2> "$work/stderr" &
server=$!
for _ in $(seq 600); do
  grep -q listening "$work/stdout" 2>/dev/null && break
  kill -0 "$server" 2>/dev/null || { cat "$work/stderr" >&2; exit 1; }
  sleep 0.1
done
port=$(sed -n 's/.*listening on http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$work/stdout")
[ -n "$port" ] || { echo "serve_load: the server did not start" >&2; exit 1; }
python3 - "$port" "$binary" "$work" <<'PY'
import json, sys, urllib.request, struct, random
port, binary, work = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
meta = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/models/m", timeout=10))
inp = meta["inputs"][0]
shape = [1 if d < 0 else d for d in inp["shape"]]
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
metric() { curl -s "http://127.0.0.1:$port/metrics" | sed -n "s/^$1{model=\"m\",version=\"1\"} //p"; }
printf '%-5s %10s %9s %9s %9s %8s %9s\n' conc req/s p50_ms p90_ms p99_ms non2xx avg_batch
for c in $conc; do
  i0=$(metric keel_inference_count) e0=$(metric keel_inference_exec_count)
  out=$(timeout $((duration + 30)) wrk -t "$(( c < 2 ? 1 : 2 ))" -c "$c" -d "${duration}s" --latency \
        -s "$work/post.lua" "http://127.0.0.1:$port/v2/models/m/infer")
  i1=$(metric keel_inference_count) e1=$(metric keel_inference_exec_count)
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  ms() { awk -v p="$1" '$1 == p {v=$2; if (v ~ /us$/) {sub(/us/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms/,"",v)} else if (v ~ /s$/) {sub(/s/,"",v); v*=1000}; printf "%.3f", v}' <<<"$out"; }
  non2xx=$(awk '/Non-2xx/ {print $NF}' <<<"$out")
  batch=$(awk -v a=$((i1 - i0)) -v b=$((e1 - e0)) 'BEGIN {printf "%.2f", b ? a / b : 0}')
  printf '%-5s %10s %9s %9s %9s %8s %9s\n' "$c" "$rps" "$(ms 50%)" "$(ms 90%)" "$(ms 99%)" "${non2xx:-0}" "$batch"
done
