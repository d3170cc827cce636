#!/usr/bin/env bash
# PaddleSlim's compression loop with Keel on Fashion-MNIST, end to end (README, "Compression: prune, distil, INT8"):
#   1. train the LeNet-like teacher in fp32                 keel train --model lenet
#   2. channel-prune it to <= 40% of its parameters          keel prune --mode channel --ratio R
#   3. fine-tune the pruned model with distillation          keel train --init pruned.onnx --teacher teacher.onnx
#      from the teacher, and the same without distillation   (same epochs, seed and learning rate) beside it
#   4. INT8 post-training quantization of both               keel quantize (calibration: 8 batches of 64 training images)
#   5. evaluate teacher and finals on the 10k test images    keel train --evaluate MODEL.onnx
#   6. batch-1 latency, teacher vs final, 1 and 2 threads    keel bench (interleaved rounds, median of the medians)
# and prints a summary (sizes, parameters, accuracies, latencies and ratios), also written to OUT/summary.json.
#
# Usage: tools/compress_recipe.sh [OUT_DIR]      (default build/compress)
# Environment: KEEL (default build/bin/keel), DATA (the Fashion-MNIST IDX folder, default keel train's),
#   TEACHER_EPOCHS (3), FINETUNE_EPOCHS (2), RATIO (0.61: the share of each Conv's output channels removed; 0.6 leaves 40.3%),
#   TEMPERATURE (4), WEIGHT (0.7: the distillation term's share of the loss), LR (0.01), SEED (0),
#   TRAIN_THREADS (2), ROUNDS (3: bench rounds per model and thread count), ITERS (2000 timed runs per bench),
#   RT (a command prefix for the timed steps, e.g. "chrt -f 10" on a shared host; default none),
#   LIMIT (train on the first N images only: a quick check of the recipe, not a measurement; default 0 = all),
#   TEACHER_DIR (the OUT_DIR of an earlier run: its teacher.onnx and teacher/ are reused, step 1 is skipped).
set -euo pipefail
case ${1:-} in
  -h | --help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "compress_recipe: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
# Before the cd below: paths the caller gives (OUT_DIR, KEEL, DATA, TEACHER_DIR) are relative to where it was called from.
out=${1:+$(realpath -m "$1")}
for v in KEEL DATA TEACHER_DIR; do
  if [ -n "${!v:-}" ]; then printf -v "$v" '%s' "$(realpath -m "${!v}")"; fi
done
cd "$(dirname "$0")/.."
out=${out:-$PWD/build/compress}
keel=${KEEL:-build/bin/keel}
data=${DATA:-/usr/share/datasets/fashion-mnist}
teacher_epochs=${TEACHER_EPOCHS:-3}
finetune_epochs=${FINETUNE_EPOCHS:-2}
ratio=${RATIO:-0.61}
temperature=${TEMPERATURE:-4}
weight=${WEIGHT:-0.7}
lr=${LR:-0.01}
seed=${SEED:-0}
threads=${TRAIN_THREADS:-2}
rounds=${ROUNDS:-3}
iters=${ITERS:-2000}
limit=${LIMIT:-0}
read -r -a rt <<<"${RT:-}"
[[ -x $keel ]] || { echo "compress_recipe: $keel not found (build the keel target first)" >&2; exit 1; }
mkdir -p "$out" "$out/teacher" "$out/kd" "$out/ce"
log() { printf '\n== %s\n' "$*"; }
run() { echo "+ $*"; "$@"; }

if [[ -n ${TEACHER_DIR:-} ]]; then
  log "1. teacher: reused from $TEACHER_DIR"
  cp "$TEACHER_DIR/teacher.onnx" "$out/teacher.onnx"
  cp -r "$TEACHER_DIR/teacher/." "$out/teacher/"
else
  log "1. teacher: LeNet-like, fp32, $teacher_epochs epochs"
  run "${rt[@]}" "$keel" --threads "$threads" train --model lenet --epochs "$teacher_epochs" --lr "$lr" --seed "$seed" \
    --limit "$limit" --data "$data" -q --no-quantize -o "$out/teacher.onnx" --log "$out/teacher/log.jsonl" \
    --run-record "$out/teacher/run.json"
fi

log "2. channel pruning: ratio $ratio of every Conv's output channels (and the Linear features behind them)"
run "$keel" prune "$out/teacher.onnx" --mode channel --ratio "$ratio" -o "$out/pruned.onnx" | tee "$out/prune.txt"

log "3. fine-tuning the pruned model, $finetune_epochs epochs: with distillation (T $temperature, weight $weight), then without"
run "${rt[@]}" "$keel" --threads "$threads" train --init "$out/pruned.onnx" --teacher "$out/teacher.onnx" \
  --distill-temperature "$temperature" --distill-weight "$weight" --epochs "$finetune_epochs" --lr "$lr" --seed "$seed" \
  --limit "$limit" --data "$data" -q --no-quantize -o "$out/student_kd.onnx" --log "$out/kd/log.jsonl" \
  --run-record "$out/kd/run.json"
run "${rt[@]}" "$keel" --threads "$threads" train --init "$out/pruned.onnx" --epochs "$finetune_epochs" --lr "$lr" \
  --seed "$seed" --limit "$limit" --data "$data" -q --no-quantize -o "$out/student_ce.onnx" --log "$out/ce/log.jsonl" \
  --run-record "$out/ce/run.json"

log "4. INT8: keel quantize, calibration from the first 8 x 64 training images (normalised as keel train does)"
python3 - "$data" "$out/calib" <<'EOF'
# Writes CALIB/batch_K/image.npy (float32 [64, 1, 28, 28], (x / 255 - 0.2860) / 0.3530) without numpy.
import gzip, os, struct, sys
data, calib = sys.argv[1], sys.argv[2]
path = os.path.join(data, "train-images-idx3-ubyte")
raw = gzip.open(path + ".gz").read() if os.path.exists(path + ".gz") else open(path, "rb").read()
magic, n, rows, cols = struct.unpack(">IIII", raw[:16])
assert magic == 2051 and rows == 28 and cols == 28, "not an IDX image file: " + path
table = [(v / 255.0 - 0.2860) / 0.3530 for v in range(256)]
for k in range(8):
    px = raw[16 + k * 64 * 784:16 + (k + 1) * 64 * 784]
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 1, 28, 28), }"
    header += " " * (127 - 10 - len(header)) + "\n"
    os.makedirs(os.path.join(calib, "batch_%d" % k), exist_ok=True)
    with open(os.path.join(calib, "batch_%d" % k, "image.npy"), "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%df" % len(px), *(table[b] for b in px)))
EOF
for s in kd ce; do
  run "$keel" quantize "$out/student_$s.onnx" -c "$out/calib" -o "$out/final_$s.int8.onnx" -q
done

log "5. evaluation on the test set (Session; the INT8 models run the fuse_qdq int8 kernels)"
for m in teacher pruned student_kd student_ce final_kd.int8 final_ce.int8; do
  run "${rt[@]}" "$keel" --threads "$threads" train --evaluate "$out/$m.onnx" --data "$data" | tee "$out/eval_$m.txt"
done

log "6. batch-1 latency: keel bench, teacher and final interleaved, $rounds rounds x $iters runs"
for r in $(seq "$rounds"); do
  for t in 1 2; do
    for m in teacher final_kd.int8; do
      "${rt[@]}" "$keel" bench "$out/$m.onnx" --threads "$t" -n "$iters" --warmup 200 --json >"$out/bench_${m}_t${t}_r$r.json"
      printf '  round %s, %s thread(s), %-14s median %s ms\n' "$r" "$t" "$m" \
        "$(python3 -c 'import json,sys; print(round(json.load(open(sys.argv[1]))["median_ms"], 4))' "$out/bench_${m}_t${t}_r$r.json")"
    done
  done
done

log "summary"
python3 - "$out" "$rounds" <<'EOF'
import glob, json, os, re, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def acc(m):
    return float(re.search(r"test accuracy ([0-9.]+)", open(os.path.join(out, "eval_%s.txt" % m)).read()).group(1))
size = lambda m: os.path.getsize(os.path.join(out, m + ".onnx"))
lat = {}
for m in ("teacher", "final_kd.int8"):
    for t in (1, 2):
        lat[m, t] = statistics.median(json.load(open(os.path.join(out, "bench_%s_t%d_r%d.json" % (m, t, r))))["median_ms"]
                                      for r in range(1, rounds + 1))
kd = json.load(open(os.path.join(out, "kd", "run.json")))
teacher_params = json.load(open(os.path.join(out, "teacher", "run.json")))["model"]["parameters"]
s = {
    "teacher": {"bytes": size("teacher"), "parameters": teacher_params, "test_accuracy": acc("teacher")},
    "pruned": {"bytes": size("pruned"), "parameters": kd["model"]["parameters"], "test_accuracy": acc("pruned")},
    "final_kd_int8": {"bytes": size("final_kd.int8"), "test_accuracy": acc("final_kd.int8"),
                      "fp32_test_accuracy": acc("student_kd")},
    "final_ce_int8": {"bytes": size("final_ce.int8"), "test_accuracy": acc("final_ce.int8"),
                      "fp32_test_accuracy": acc("student_ce")},
    "latency_ms": {"%s_%dt" % (m.replace(".int8", "_int8"), t): v for (m, t), v in lat.items()},
    "distillation": kd.get("distillation"),
}
s["parameters_kept"] = s["pruned"]["parameters"] / teacher_params
s["size_reduction"] = 1 - s["final_kd_int8"]["bytes"] / s["teacher"]["bytes"]
s["accuracy_gap_kd_points"] = 100 * (s["teacher"]["test_accuracy"] - s["final_kd_int8"]["test_accuracy"])
s["accuracy_gap_ce_points"] = 100 * (s["teacher"]["test_accuracy"] - s["final_ce_int8"]["test_accuracy"])
s["speedup"] = {"%dt" % t: lat["teacher", t] / lat["final_kd.int8", t] for t in (1, 2)}
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=2)
print("teacher        %8d bytes  %8d params  test acc %.4f" % (s["teacher"]["bytes"], teacher_params, s["teacher"]["test_accuracy"]))
print("pruned (fp32)  %8d bytes  %8d params (%.1f%%)  test acc %.4f (before fine-tuning)" % (
    s["pruned"]["bytes"], s["pruned"]["parameters"], 100 * s["parameters_kept"], s["pruned"]["test_accuracy"]))
for k, name in (("final_kd_int8", "final, distilled"), ("final_ce_int8", "final, labels only")):
    print("%-18s INT8 %8d bytes (-%.1f%%)  test acc %.4f (fp32 %.4f), gap to teacher %+.2f points" % (
        name, s[k]["bytes"], 100 * (1 - s[k]["bytes"] / s["teacher"]["bytes"]), s[k]["test_accuracy"],
        s[k]["fp32_test_accuracy"], 100 * (s[k]["test_accuracy"] - s["teacher"]["test_accuracy"])))
for t in (1, 2):
    print("batch-1 latency, %d thread(s): teacher %.4f ms, final %.4f ms: %.2fx lower" % (
        t, lat["teacher", t], lat["final_kd.int8", t], s["speedup"]["%dt" % t]))
print("summary: %s" % os.path.join(out, "summary.json"))
EOF
