#!/usr/bin/env bash
# tools/gpu_check.sh — check Keel's CUDA plugin on an air-gapped GPU host (issue 8).
#
#   tools/gpu_check.sh bundle [--build DIR] [--out DIR] [--max-mb N] [--dry-run]
#       On the build machine: pack build/bin/keel (+ keel-cts, the cuda/nccl, I/O-binding and device-index test
#       binaries when built),
#       build/lib/libkeel_*.so* (libkeel_core and libkeel_train, which the binaries link), the plugins a GPU run
#       uses (build/lib/keel/plugins/: every plugin but the host-only ones, cpu_onednn, gloo and the null skeleton,
#       whose libraries are most of a bundle: oneDNN alone is 38 MB; host fallbacks run on the core's reference
#       kernels) and the Debian shared libraries they need (resolved with ldd; libc, libstdc++, libm, libpthread,
#       ld-linux and CUDA's own libraries excluded: the GPU host has those) plus the peers' model generator
#       (shared/peers/make_models.py) and tools/gpu_torch_bench.py into gpu-bundle/ (git-ignored; no models), every
#       binary stripped. Prints its size and fails above --max-mb (default 40: the device tool carries at most
#       64 MiB, working tree included). The test gpu_check_bundle_size runs this on every build.
#   tools/gpu_check.sh run [--bundle DIR] [--models a,b] [--work DIR] [--budget S] [--steps a,b] [--train-device D]
#                          [--log FILE] [--dry-run]
#       On the GPU host, from inside the bundle (or --bundle DIR): points the loader at the bundle's libraries and at
#       the nvidia-* wheels' libraries of the host python3, generates the models with make_models.py (TorchScript
#       exporter), runs `keel plugins`, the device conformance suite on cuda (keel-cts), the NCCL and cuda plugin
#       tests, `keel run --device cuda` on every model against the PyTorch reference output (fp32: rtol 1e-3;
#       --precision fp16: rtol 1e-2, or within twice PyTorch's own fp16 error on the card), then benchmarks ResNet-18 and the transformer encoder at batch 1 and 64, fp32
#       and fp16, Keel (`keel bench --device cuda --json`) against PyTorch eager on the same GPU
#       (gpu_torch_bench.py) and prints a table of latencies, throughputs and ratios with the issue's targets
#       (batch 64 fp16: Keel >= 1.1x PyTorch's throughput; batch 1: Keel's latency no worse). The training step
#       trains SimpleCNN and the LeNet-like model in fp32 and fp16 on the card and prints their accuracy against
#       Keel's CPU run (±0.5 point), their epoch time against PyTorch eager's (gpu_torch_bench.py --train; Keel
#       <= 0.8x) and the fp16 / fp32 ratio of their peak memory (<= 0.65), and trains SimpleCNN with AdamW on the
#       card and on the CPU (test accuracy within a point). The profile step prints where the time
#       goes (KEEL_EAGER_PROFILE's second epoch of training, keel bench --profile of ResNet-18). The graph step runs
#       the convolutions through cuDNN's graph API with cached plans (KEEL_CUDNN_GRAPH=1, opt-in until measured):
#       their conformance cases, the four training runs and ResNet-18 at batch 1 against the legacy calls.
#       --steps runs a
#       subset of models, plugins, dp, train, cts, tests, infer, graph, bench, profile (default: all); --train-device cpu
#       runs the training step on the host (checks the script where there is no GPU). Steps run in the order
#       models, plugins, dp, train, cts, tests, infer, graph, bench, profile (what has never run on a card first).
#       Every step has a timeout inside an overall budget (default 360 s: a second run fits in the device tool's 15
#       minutes) and prints the elapsed time; the last line names the steps that failed. Where $OUT is set (the
#       device tool's folder that comes back) or --log FILE is given, everything printed also goes to that log
#       ($OUT/gpu_check.log), and the training and benchmark records are copied into $OUT/gpu_check_records/: the
#       device tool's reply keeps only the end of the output. The bundle's REVISION (the commit it was built
#       from) is printed, with a warning when the checkout's differs. Exit status: 0 when every check passed
#       (targets missed are reported, not failures). --dry-run prints the plan only.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
mode="${1:-}"
[[ $# -gt 0 ]] && shift
die() { echo "gpu_check: $*" >&2; exit 2; }
usage() { sed -n '2,40p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

case "$mode" in
  bundle)
    build="$repo/build"; out="$repo/gpu-bundle"; dry=0; max_mb=40
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --build) build="${2:?--build DIR}"; shift 2 ;;
        --max-mb) max_mb="${2:?--max-mb N}"; shift 2 ;;
        --out) out="${2:?--out DIR}"; shift 2 ;;
        --dry-run) dry=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "bundle: unknown argument '$1'" ;;
      esac
    done
    [[ -x "$build/bin/keel" ]] || die "no $build/bin/keel: build first (ninja -C build keel)"
    [[ -f "$build/lib/keel/plugins/libkeel_cuda.so" ]] || echo "gpu_check: warning: no CUDA plugin in $build (toolkit absent at build time?)" >&2
    gen="$repo/../shared/peers/make_models.py"
    [[ -f "$gen" ]] || gen="/work/shared/peers/make_models.py"
    [[ -f "$gen" ]] || { echo "gpu_check: warning: no ../shared/peers/make_models.py: the bundle's run will need --bundle beside a checkout that has it" >&2; gen=""; }
    bins=("$build/bin/keel")
    for b in keel-cts nccl_plugin_test cuda_plugin_test io_binding_test device_index_test; do
      [[ -x "$build/bin/$b" ]] && bins+=("$build/bin/$b")
    done
    torch_bench="$repo/tools/gpu_torch_bench.py"
    [[ -f "$torch_bench" ]] || die "no $torch_bench"
    # Plugins: a manifest and the library it names, minus the host-only ones (a GPU run falls back to the core's
    # reference kernels on the host, and its collectives are NCCL's).
    host_only='^(cpu_onednn|gloo|null)$'
    plugins=()
    for m in "$build"/lib/keel/plugins/*.keel-plugin.toml; do
      [[ -f "$m" ]] || continue
      name=$(sed -n 's/^name *= *"\([^"]*\)".*/\1/p' "$m" | head -1)
      lib=$(sed -n 's/^library *= *"\([^"]*\)".*/\1/p' "$m" | head -1)
      [[ -n "$name" && -n "$lib" ]] || die "manifest $m names no plugin or library"
      [[ "$name" =~ $host_only ]] && continue
      [[ -f "$build/lib/keel/plugins/$lib" ]] || { echo "gpu_check: warning: $m: no $lib, skipped" >&2; continue; }
      plugins+=("$m" "$build/lib/keel/plugins/$lib")
      # A plugin's companion libraries beside it (libkeel_cuda.so loads libkeel_cuda_kernels.so once it finds a GPU).
      for comp in "$build/lib/keel/plugins/${lib%.so}"_*.so; do
        [[ -f "$comp" ]] && plugins+=("$comp")
      done
    done
    if [[ $dry -eq 1 ]]; then echo "would pack: ${bins[*]} $build/lib/libkeel_*.so* ${plugins[*]} $gen $torch_bench -> $out"; exit 0; fi
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/lib/keel/plugins" "$out/deps" "$out/peers"
    cp -a "${bins[@]}" "$out/bin/"
    cp -a "$build"/lib/libkeel_*.so* "$out/lib/"
    [[ ${#plugins[@]} -eq 0 ]] || cp -a "${plugins[@]}" "$out/lib/keel/plugins/"
    [[ -z "$gen" ]] || cp "$gen" "$out/peers/"
    cp "$torch_bench" "$out/peers/"
    cp "${BASH_SOURCE[0]}" "$out/gpu_check.sh"
    # The commit the binaries were built from (and whether the tree had changes), for the run to compare.
    rev=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
    [[ -n "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]] && rev="$rev (with uncommitted changes)"
    echo "$rev" > "$out/REVISION"
    # The Debian libraries the binaries and plugins need, minus the base system and CUDA's own libraries.
    skip='^(linux-vdso|libc\.so|libstdc\+\+|libm\.so|libpthread|ld-linux|libdl\.so|librt\.so|libgcc_s|libcuda|libcudart|libcublas|libcublasLt|libcudnn|libnccl|libnvrtc|libnvJitLink|libkeel)'
    objs=("$out"/bin/* "$out"/lib/keel/plugins/*.so)
    for o in "${objs[@]}"; do
      LD_LIBRARY_PATH="$build/lib:${LD_LIBRARY_PATH:-}" ldd "$o" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
    done | sort -u | while read -r name path; do
      [[ "$name" =~ $skip ]] && continue
      cp -L "$path" "$out/deps/$name"
    done
    # Debug info is most of a RelWithDebInfo build: the GPU host gets stripped copies.
    for f in "$out"/bin/* "$out"/lib/libkeel_*.so* "$out"/lib/keel/plugins/*.so "$out"/deps/*; do
      [[ -f "$f" && ! -L "$f" ]] && strip --strip-unneeded "$f" 2>/dev/null
    done
    size_kb=$(du -sk "$out" | cut -f1)
    echo "gpu_check: bundle $out: $((size_kb / 1024)) MB ($(ls "$out/deps" | wc -l) Debian libraries in deps/)"
    ls "$out/deps" | sed 's/^/  deps: /'
    if [[ $size_kb -gt $((max_mb * 1024)) ]]; then
      du -ak "$out" | sort -n | tail -8 | sed 's/^/  largest (KiB): /' >&2
      die "bundle is over $max_mb MB ($((size_kb / 1024)) MB): drop what a GPU run does not need"
    fi
    ;;

  run)
    bundle="$here"; models="simple_cnn,simple_cnn_b32,resnet18,mobilenet_v2,squeezenet1_1,transformer_enc"
    work="${TMPDIR:-/tmp}/keel-gpu-check"; dry=0; budget=360; log="${OUT:+$OUT/gpu_check.log}"
    steps="models,plugins,dp,train,cts,tests,infer,graph,bench,profile"; train_device=cuda
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --bundle) bundle="${2:?--bundle DIR}"; shift 2 ;;
        --models) models="${2:?--models a,b}"; shift 2 ;;
        --work) work="${2:?--work DIR}"; shift 2 ;;
        --budget) budget="${2:?--budget SECONDS}"; shift 2 ;;
        --steps) steps="${2:?--steps a,b}"; shift 2 ;;
        --train-device) train_device="${2:?--train-device cuda|cpu}"; shift 2 ;;
        --log) log="${2:?--log FILE}"; shift 2 ;;
        --dry-run) dry=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "run: unknown argument '$1'" ;;
      esac
    done
    for s in ${steps//,/ }; do
      [[ $s =~ ^(models|plugins|cts|tests|infer|dp|train|graph|bench|profile)$ ]] || die "run: --steps: unknown step '$s'"
    done
    want() { [[ ",$steps," == *",$1,"* ]]; }
    [[ -x "$bundle/bin/keel" || ! -x "$repo/gpu-bundle/bin/keel" ]] || bundle="$repo/gpu-bundle"  # run from a checkout
    bundle="$(cd "$bundle" 2>/dev/null && pwd)" || die "no bundle folder"
    [[ -x "$bundle/bin/keel" ]] || die "no $bundle/bin/keel: pass --bundle DIR (a folder made by 'gpu_check.sh bundle')"
    py="${PYTHON:-python3}"
    peers="$bundle/peers"
    [[ -f "$peers/make_models.py" ]] || peers="$repo/../shared/peers"
    torch_bench="$bundle/peers/gpu_torch_bench.py"
    [[ -f "$torch_bench" ]] || torch_bench="$here/gpu_torch_bench.py"
    # The nvidia-* wheels' libraries (cudart, cublas, cudnn, nccl) of the host's python.
    wheel_libs="$("$py" - <<'PY' 2>/dev/null
import glob, os
try:
    import nvidia
    roots = [os.path.dirname(p) for p in nvidia.__path__]
except Exception:
    roots = []
dirs = set()
for r in roots:
    for so in glob.glob(os.path.join(r, "nvidia", "**", "lib*.so*"), recursive=True):
        dirs.add(os.path.dirname(so))
print(":".join(sorted(dirs)))
PY
)"
    # The toolkit's own libraries last, where the host has a toolkit beside (or instead of) the wheels.
    cuda_libs=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [[ -d $d ]] && cuda_libs="${cuda_libs:+$cuda_libs:}$d"; done
    export LD_LIBRARY_PATH="$bundle/lib:$bundle/deps${wheel_libs:+:$wheel_libs}${cuda_libs:+:$cuda_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    keel="$bundle/bin/keel"
    bench_models="resnet18 transformer_enc"
    if [[ -n "$log" && $dry -eq 0 ]]; then
      mkdir -p "$(dirname "$log")"
      exec > >(tee "$log") 2>&1
    fi
    echo "gpu_check: bundle $bundle, models $models, work $work, budget $budget s${log:+, log $log}"
    built=$(cat "$bundle/REVISION" 2>/dev/null || echo "unknown (no REVISION: an older bundle)")
    here_rev=$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)
    echo "gpu_check: bundle built from $built; this checkout is at $here_rev"
    [[ "${built%% *}" == "$here_rev" || "$here_rev" == unknown ]] ||
      echo "gpu_check: WARNING: the bundle was not built from this checkout's commit (run 'gpu_check.sh bundle' after the last build)"
    echo "gpu_check: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    if [[ $dry -eq 1 ]]; then
      cat <<PLAN
plan (steps $steps; each step: min(its own timeout, what is left of $budget s)):
  150 s  make_models.py --out $work/models ${models//,/ }   (from $peers, torch.onnx.export with dynamo=False),
         and ${bench_models} again at batch 64 into $work/models/b64/
   20 s  keel plugins
   90 s  keel launch --nproc-per-node 1 -- keel train --device cuda (synthetic data): the data-parallel path on NCCL
  120 s  per model simple|lenet: keel train --device cpu, 1 epoch of a synthetic set (6,400 / 10,000 images)
   60 s  per (model, amp none|fp16): keel train --device $train_device --amp AMP, 2 epochs of the same set
   60 s  per device cpu|$train_device: keel train --model simple --optimizer adamw, 1 epoch (accuracy within a point)
  150 s  $torch_bench --train (the same loop in PyTorch eager: both models, fp32 and fp16, 2 epochs)
         then the table: accuracy vs the CPU run, epoch-2 time vs PyTorch, fp16 / fp32 peak memory
  100 s  keel-cts --device cuda --kernel-prefix cuda_
   45 s  keel-cts --device cuda --random-grads 300 (random backward ops against the reference)
   60 s  nccl_plugin_test (one rank: init, all-reduce, ..., teardown, a peer that never joins)
   90 s  cuda_plugin_test
   25 s  per model: keel run --device cuda [--precision fp16] vs test_data_set_0/output_0.pb (rtol 1e-3 / 1e-2)
   90 s  KEEL_CUDNN_GRAPH=1: keel-cts --op Conv|FusedConv|ConvGrad; the four training runs again (epoch-2 time against
         the legacy calls' and PyTorch's); lenet fp32 with KEEL_EAGER_COPY=sync (eager copies that wait, as before);
         keel bench resnet18 batch 1 fp32|fp16 with and without; the host profile of lenet fp32
  100 s  $torch_bench --models ${bench_models// /,} --batches 1,64 --precisions fp32,fp16 --json
   30 s  per (model, batch, precision): keel bench MODEL --device cuda [--precision fp16] --json (batch 64: the
         models/b64/ export of the same weights)
         then the table: Keel vs PyTorch eager latency, throughput, ratio, targets
   60 s  per run: KEEL_EAGER_PROFILE=1|sync keel train (lenet fp32 and fp16, simple fp16): the second epoch's ops
   30 s  keel bench resnet18 --device cuda --profile; at batch 64 in fp16 (slowest nodes) and fp32 with TF32 off / on
PLAN
      exit 0
    fi
    start=$(date +%s)
    failed_steps=()  # one entry per failure: the step it happened in
    current_step=""
    mkdir -p "$work"
    elapsed() { echo $(( $(date +%s) - start )); }
    step() { current_step="$1"; echo; echo "=== $1 ($(elapsed) s elapsed)"; }
    fail() { failed_steps+=("${current_step:-set-up}"); }
    # run_timed SECONDS CMD...: runs CMD under min(SECONDS, what is left of the budget); 124 when skipped/killed.
    run_timed() {
      local want="$1"; shift
      local left=$(( budget - $(elapsed) ))
      if [[ $left -lt 5 ]]; then echo "  skipped: the ${budget} s budget is spent"; return 124; fi
      [[ $want -gt $left ]] && want=$left
      timeout --kill-after=5 "$want" "$@"
      local rc=$?
      [[ $rc -eq 124 || $rc -eq 137 ]] && echo "  timed out after ${want} s"
      return $rc
    }

    if want models; then
      step "generate models"
      needed="$models"
      for m in $bench_models; do [[ ",$needed," == *",$m,"* ]] || needed="$needed,$m"; done
      # The benchmarked models again at batch 64 under models/b64/ (the same seeded weights): the exports bake the
      # batch into some shapes (the transformer's reshapes), so `keel bench --batch 64` cannot resize them.
      run_timed 150 "$py" - "$peers" "$work/models" "${bench_models// /,}" ${needed//,/ } <<'PY' || { echo "make_models failed"; fail; }
import functools, inspect, os, sys
peers, out, bench, names = sys.argv[1], sys.argv[2], sys.argv[3].split(","), sys.argv[4:]
sys.path.insert(0, peers)
import torch
ex = torch.onnx.export
if "dynamo" in inspect.signature(ex).parameters:  # torch >= 2.5: keep the TorchScript exporter the peers used
    @functools.wraps(ex)
    def legacy(*a, **k):
        k.setdefault("dynamo", False)
        return ex(*a, **k)
    torch.onnx.export = legacy
import make_models
sys.argv = ["make_models.py", "--out", out] + names
make_models.main()
torch.set_num_threads(os.cpu_count() or 2)
for name in bench:
    seed, builder, shape = make_models.MODELS[name]
    make_models.MODELS[name] = (seed, builder, (64,) + tuple(shape[1:]))
    make_models.export(name, os.path.join(out, "b64"))
    make_models.MODELS[name] = (seed, builder, shape)
# The yardstick for Keel's fp16 outputs: PyTorch's own fp16 error on the card (the model in half precision, same
# input) against the fp32 reference, per model, in torch_fp16_err.txt beside the model.
if torch.cuda.is_available():
    import numpy as np
    from onnx import numpy_helper
    import onnx
    for name in names:
        try:
            m, x = make_models.build_model(name)
            ref = onnx.TensorProto()
            ref.ParseFromString(open(os.path.join(out, name, "test_data_set_0", "output_0.pb"), "rb").read())
            ref = numpy_helper.to_array(ref).astype(np.float64)
            with torch.no_grad():
                yh = m.half().cuda()(x.half().cuda()).float().cpu().numpy().astype(np.float64)
            err = float(np.abs(yh - ref).max())
            open(os.path.join(out, name, "torch_fp16_err.txt"), "w").write(f"{err:.6e}\n")
            print(f"[{name}] PyTorch fp16 on the card: max abs err {err:.3e} against the fp32 reference")
        except Exception as e:  # noqa: BLE001 (a yardstick only: its absence leaves the plain rtol check)
            print(f"[{name}] no PyTorch fp16 yardstick: {type(e).__name__}: {e}")
PY
    fi
    if want plugins; then
      step "keel plugins"
      nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | sed 's/^/  gpu: /'
      for so in "$bundle"/lib/keel/plugins/*.so; do  # a library the loader cannot find is the first thing to rule out
        missing=$(ldd "$so" 2>&1 | grep 'not found')
        [[ -z "$missing" ]] || echo "  $(basename "$so"): $missing"
      done
      run_timed 20 "$keel" plugins || fail
    fi
    if want dp; then
      step "data-parallel: one rank on cuda over NCCL (keel launch --nproc-per-node 1 -- keel train)"
      # Synthetic IDX files (the device machine has no dataset package): 1,280 training and 256 test images. One rank
      # under a launcher takes the whole data-parallel path: NCCL communicator, parameter broadcast, gradient buckets
      # all-reduced on the card, averaged, optimizer step.
      "$py" - "$work/dp_data" <<'PY' || { echo "synthetic data failed"; fail; }
import os, struct, sys, numpy as np
d = sys.argv[1]; os.makedirs(d, exist_ok=True); rng = np.random.default_rng(0)
for prefix, n in (("train", 1280), ("t10k", 256)):
    y = rng.integers(0, 10, n, dtype=np.uint8)
    x = (rng.random((n, 28, 28)) * 40 + y[:, None, None] * 20).astype(np.uint8)
    open(f"{d}/{prefix}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 28, 28) + x.tobytes())
    open(f"{d}/{prefix}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + y.tobytes())
PY
      dp_out=$(run_timed 90 "$keel" launch --nproc-per-node 1 -- "$keel" train --device cuda --data "$work/dp_data" \
                 --epochs 1 -o '' --no-quantize -q 2>&1)
      rc=$?
      echo "$dp_out" | tail -8
      if [[ $rc -ne 0 ]] || ! grep -q "world size 1 (nccl)" <<<"$dp_out"; then
        echo "  data-parallel step FAILED (rc $rc; want 'world size 1 (nccl)' and exit 0)"; fail
      elif ! grep -q "all-reduces on a communication stream" <<<"$dp_out"; then
        echo "  data-parallel step FAILED: the all-reduces did not get a communication stream on the card"
        fail
      fi
    fi
    if want train; then
      # Eager training, Keel against its CPU run and against PyTorch eager on the same device: SimpleCNN and the
      # LeNet-like model, 2 epochs each of a synthetic set (the device machine has no dataset package; a 3-row band
      # whose height names the class, jittered by a row so that neighbours overlap: about 70 % is the best any model
      # reaches, so accuracies are compared below their ceiling of 100 %), fp32 and fp16 (dynamic loss scaling). The
      # backward kernels are cuda_train_ops.cc's; any op the plugin lacks runs on the CPU with one warning per op
      # type (counted). Compared: test accuracy after epoch 1 with a 1-epoch CPU run of Keel (±0.5 point, on 10,000 test
      # images: with 2,000 one image was 0.05 point, and the runs of 2026-12-04 differed by 15 images), the second
      # epoch's time (warm-up excluded) with gpu_torch_bench.py --train (Keel <= 0.8x), and each run's peak of the
      # device pool (keel train's "peak memory" = CachingAllocator; torch.cuda.max_memory_allocated), fp16 against
      # fp32 (<= 0.65x).
      step "train: synthetic data (6,400 training / 10,000 test images)"
      tw="$work/train"; rm -rf "$tw"; mkdir -p "$tw"
      "$py" - "$tw/data" <<'PY' || { echo "synthetic data failed"; fail; }
import os, struct, sys, numpy as np
d = sys.argv[1]; os.makedirs(d, exist_ok=True); rng = np.random.default_rng(0)
for prefix, n in (("train", 6400), ("t10k", 10000)):
    y = rng.integers(0, 10, n, dtype=np.uint8)
    x = rng.normal(70, 45, (n, 28, 28))
    rows = 3 + 2 * y.astype(np.int64) + rng.integers(-1, 2, n)
    for k in range(3):
        x[np.arange(n), rows + k, 4:24] += 45
    x = np.clip(x, 0, 255).astype(np.uint8)
    open(f"{d}/{prefix}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, n, 28, 28) + x.tobytes())
    open(f"{d}/{prefix}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, n) + y.tobytes())
PY
      train_args=(--data "$tw/data" -o '' --no-quantize -q --histogram-bins 0 --log-every 0)
      amps="none fp16"; precs=fp32,fp16
      [[ $train_device == cpu ]] && amps=none && precs=fp32  # the script's own check: fp16 autocast is for cards
      # A device run that times out (a stall, say in the asynchronous eager copies, never run on a card) is run once
      # more with KEEL_EAGER_COPY=sync (copies that wait, as before them), and the device's later training runs are
      # skipped: one hang must not spend the whole budget.
      stalled=0
      for tm in simple lenet; do
        step "train: keel train --model $tm --device cpu --epochs 1 (the accuracy reference)"
        run_timed 120 "$keel" train --model "$tm" --device cpu --epochs 1 "${train_args[@]}" \
          --run-record "$tw/keel_${tm}_cpu.json" 2>&1 | tail -3
        [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "  CPU training FAILED"; fail; }
        for amp in $amps; do
          step "train: keel train --model $tm --device $train_device --amp $amp --epochs 2"
          if [[ $stalled -eq 1 ]]; then echo "  skipped: an earlier run on $train_device timed out"; fail; continue; fi
          tr_out=$(run_timed 60 "$keel" train --model "$tm" --device "$train_device" --amp "$amp" --epochs 2 \
                     "${train_args[@]}" --run-record "$tw/keel_${tm}_${amp}.json" 2>&1)
          rc=$?
          echo "$tr_out" | tail -8
          echo "  ops on the CPU fallback: $(grep -c 'runs on the CPU' <<<"$tr_out")"
          if [[ $rc -ne 0 ]]; then echo "  training step FAILED (rc $rc)"; fail; fi
          if [[ $rc -eq 124 || $rc -eq 137 ]]; then
            stalled=1
            echo "  once more with KEEL_EAGER_COPY=sync, 1 epoch:"
            run_timed 40 env KEEL_EAGER_COPY=sync "$keel" train --model "$tm" --device "$train_device" --amp "$amp" \
              --epochs 1 "${train_args[@]}" --run-record '' 2>&1 | tail -4
          fi
        done
      done
      # AdamW (keel.AdamStep on the card; adam_loop on the host): one epoch of SimpleCNN on each, test accuracy within
      # a point (the same f32 operations; only the convolutions' summation order differs).
      step "train: keel train --model simple --optimizer adamw, $train_device against the CPU"
      for dev in cpu "$train_device"; do
        [[ $dev != cpu && $stalled -eq 1 ]] && { echo "  $dev: skipped (an earlier run timed out)"; continue; }
        run_timed 60 "$keel" train --model simple --optimizer adamw --lr 0.001 --device "$dev" --epochs 1 \
          "${train_args[@]}" --run-record "$tw/keel_adamw_$dev.json" 2>&1 | tail -2
      done
      "$py" - "$tw/keel_adamw_cpu.json" "$tw/keel_adamw_$train_device.json" <<'PY' || fail
import json, sys
try:
    a, b = (json.load(open(p))["epochs"][0]["test_accuracy"] for p in sys.argv[1:3])
except (OSError, ValueError, KeyError, IndexError) as e:
    print(f"  AdamW comparison: no record ({e})"); sys.exit(1)
ok = abs(a - b) <= 0.01
print(f"  AdamW test accuracy: cpu {a:.4f}, device {b:.4f}: {'OK' if ok else 'MISMATCH (more than a point apart)'}")
sys.exit(0 if ok else 1)
PY
      step "train: PyTorch eager, the same loop (gpu_torch_bench.py --train)"
      run_timed 150 "$py" "$torch_bench" --train --data "$tw/data" --device "$train_device" --models simple,lenet \
        --precisions "$precs" --epochs 2 --json > "$tw/torch.jsonl" || fail
      cat "$tw/torch.jsonl"
      step "train: Keel vs its CPU run and PyTorch eager on $train_device"
      "$py" - "$tw" <<'PY' || fail
import json, os, sys
tw = sys.argv[1]
def record(name):
    try:
        with open(os.path.join(tw, name)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None
torch = {}
try:
    for line in filter(str.strip, open(os.path.join(tw, "torch.jsonl"))):
        r = json.loads(line)
        torch[(r["model"], r["precision"])] = r
except (OSError, ValueError):
    pass
mib = lambda b: b / 2**20
def epoch(rec, i, key):
    try:
        return rec["epochs"][i][key]
    except (TypeError, KeyError, IndexError):
        return None
def peak(rec):
    try:
        return rec["final"]["peak_memory_in_use_bytes"]
    except (TypeError, KeyError):
        return None
fmt = lambda v, f: format(v, f) if v is not None else format("-", ">" + f.split(".")[0])
print(f"{'model':7s} {'prec':4s} {'cpu acc':>8s} {'acc':>7s} {'diff':>6s}  {'(<=0.5)':7s} {'keel s':>7s} {'torch s':>7s} "
      f"{'ratio':>5s} {'(<=0.8)':7s} {'torch acc':>9s} {'peak MiB':>8s} {'torch MiB':>9s}")
met = total = broken = 0
for model in ("simple", "lenet"):
    cpu_acc = epoch(record(f"keel_{model}_cpu.json"), 0, "test_accuracy")
    peaks = {}
    for amp, prec in (("none", "fp32"), ("fp16", "fp16")):
        k, t = record(f"keel_{model}_{amp}.json"), torch.get((model, prec))
        acc, secs = epoch(k, 0, "test_accuracy"), epoch(k, -1, "seconds")
        tsecs = t["epoch_seconds"] if t else None
        diff = 100 * abs(acc - cpu_acc) if acc is not None and cpu_acc is not None else None
        ratio = secs / tsecs if secs and tsecs else None
        marks = []
        for value, limit in ((diff, 0.5), (ratio, 0.8)):
            total += 1
            ok = value is not None and value <= limit
            met += ok
            marks.append("met" if ok else "MISSED")
        if diff is not None and diff > 5:
            broken += 1  # not a near miss: the device's training is wrong
        peaks[prec] = (peak(k), t["peak_memory_bytes"] if t else None)
        print(f"{model:7s} {prec:4s} {fmt(cpu_acc, '8.4f')} {fmt(acc, '7.4f')} {fmt(diff, '6.2f')}  {marks[0]:7s} "
              f"{fmt(secs, '7.3f')} {fmt(tsecs, '7.3f')} {fmt(ratio, '5.2f')} {marks[1]:7s} "
              f"{fmt(t['test_accuracy'] if t else None, '9.4f')} {fmt(mib(peaks[prec][0]) if peaks[prec][0] else None, '8.1f')} "
              f"{fmt(mib(peaks[prec][1]) if peaks[prec][1] else None, '9.1f')}")
    (k32, t32), (k16, t16) = peaks["fp32"], peaks["fp16"]
    kr = k16 / k32 if k16 and k32 else None
    tr = t16 / t32 if t16 and t32 else None
    total += 1
    ok = kr is not None and kr <= 0.65
    met += ok
    print(f"{model:7s} peak memory fp16 / fp32: Keel {fmt(kr, '.2f')} ({'met' if ok else 'MISSED'}: <= 0.65), "
          f"PyTorch {fmt(tr, '.2f')}")
print(f"training targets met: {met}/{total} (acc after epoch 1, points against Keel on the CPU; time of epoch 2, "
      f"Keel / PyTorch eager; peaks of the device pool)")
if broken:
    print(f"{broken} run(s) more than 5 points off the CPU run: training on the device is wrong")
sys.exit(1 if broken else 0)
PY
    fi
    if want cts; then
      if [[ -x "$bundle/bin/keel-cts" ]]; then
        step "device conformance suite on cuda"
        run_timed 100 "$bundle/bin/keel-cts" --device cuda --kernel-prefix cuda_ | tail -60 || fail
        step "random gradients on cuda (300 backward ops at random geometries, f32)"
        run_timed 45 "$bundle/bin/keel-cts" -q --device cuda --kernel-prefix cuda_ --random-grads 300 --seed 1 |
          tail -25 || fail
      fi
    fi
    if want tests; then
      for t in nccl_plugin_test cuda_plugin_test io_binding_test device_index_test; do
        [[ -x "$bundle/bin/$t" ]] || continue
        step "$t"
        to=60; [[ $t == cuda_plugin_test ]] && to=90
        # The I/O-binding and device-index suites' GPU cases only: their other cases load test plugins and run the
        # keel binary from the build tree, which the bundle does not carry (CI runs them).
        filter='*'
        [[ $t == io_binding_test ]] && filter='IoBindingCuda.*'
        [[ $t == device_index_test ]] && filter='DeviceIndexGpu.*'
        run_timed $to "$bundle/bin/$t" --gtest_brief=1 "--gtest_filter=$filter" || fail
      done
    fi
    if want infer; then
      compare() {  # compare REF OUT RTOL [YARDSTICK]: YARDSTICK = PyTorch's fp16 max abs error on the same input
        "$py" - "$1" "$2" "$3" "${4:-}" <<'PY'
import os, sys, numpy as np, onnx
from onnx import numpy_helper
def load(p):
    t = onnx.TensorProto(); t.ParseFromString(open(p, "rb").read()); return numpy_helper.to_array(t).astype(np.float64)
ref, out, rtol = load(sys.argv[1]), load(sys.argv[2]), float(sys.argv[3])
ok = out.shape == ref.shape
err = np.abs(out - ref) if ok else np.array([np.inf])
tol = 0.1 * rtol * max(1.0, np.abs(ref).max()) + rtol * np.abs(ref)
within = ok and bool((err <= tol).all())
note = f"rtol {rtol:g}"
yard = sys.argv[4] if len(sys.argv) > 4 else ""
if ok and not within and yard and os.path.exists(yard):
    # Half precision through a deep network: no worse than twice PyTorch's own fp16 error on the card.
    t = float(open(yard).read())
    within = float(err.max()) <= 2 * t
    note += f"; PyTorch fp16 max abs err {t:.3e}, allowed 2x"
print(f"  max abs err {err.max():.3e}, max |ref| {np.abs(ref).max():.3e}: {'OK' if within else 'MISMATCH'} ({note})")
sys.exit(0 if within else 1)
PY
      }
      for m in ${models//,/ }; do
        d="$work/models/$m"
        [[ -f "$d/model.onnx" ]] || { current_step="$m: no model"; echo "$m: no model"; fail; continue; }
        for prec in fp32 fp16; do
          step "$m: cuda $prec vs the PyTorch reference"
          o="$work/out_${m}_$prec"; rm -rf "$o"; mkdir -p "$o"
          pflag=(); rtol=1e-3
          [[ $prec == fp16 ]] && pflag=(--precision fp16) && rtol=1e-2
          if ! run_timed 25 "$keel" run --device cuda "${pflag[@]}" -i "input=$d/test_data_set_0/input_0.pb" -o "$o" --print 0 "$d/model.onnx"; then
            fail; continue
          fi
          yard=""; [[ $prec == fp16 ]] && yard="$d/torch_fp16_err.txt"
          compare "$d/test_data_set_0/output_0.pb" "$o/output_0.pb" "$rtol" "$yard" || fail
        done
      done
    fi

    if want graph; then
      # cuDNN's graph API with execution plans cached per shape (cuda_dnn_graph.h), against the legacy calls: the
      # same conformance cases, training runs and ResNet-18 latency. A kernel that cannot use it logs why and keeps
      # the legacy call; those lines are counted.
      step "cuDNN graph API (KEEL_CUDNN_GRAPH=1): conformance of the convolutions"
      if [[ -x "$bundle/bin/keel-cts" ]]; then
        for op in Conv FusedConv ConvGrad; do
          out=$(KEEL_CUDNN_GRAPH=1 run_timed 60 "$bundle/bin/keel-cts" --device cuda --op "$op" --kernel-prefix cuda_ 2>&1)
          [[ $? -eq 0 ]] || fail
          echo "$out" | grep -E '^(FAIL|ERROR|device )' | head -12
          echo "  $op: $(grep -c 'graph API is not used' <<<"$out") kernel(s) fell back to the legacy call"
          grep -m3 'graph API is not used' <<<"$out" | sed 's/^/    /'
        done
      fi
      gw="$work/train"
      if [[ -f "$gw/data/train-images-idx3-ubyte" ]]; then
        for run in "lenet none" "lenet fp16" "simple none" "simple fp16"; do
          set -- $run
          step "cuDNN graph API: keel train --model $1 --amp $2 --device $train_device --epochs 2"
          out=$(KEEL_CUDNN_GRAPH=1 run_timed 60 "$keel" train --model "$1" --device "$train_device" --amp "$2" --epochs 2 \
                  --data "$gw/data" -o '' --no-quantize -q --histogram-bins 0 --log-every 0 \
                  --run-record "$gw/keel_${1}_${2}_graph.json" 2>&1)
          [[ $? -eq 0 ]] || { echo "  training FAILED"; fail; }
          echo "$out" | grep -E '^epoch 2|graph API is not used' | head -5
        done
        "$py" - "$gw" <<'PY' || true
import json, os, sys
tw = sys.argv[1]
def epoch(name, i, key):
    try:
        return json.load(open(os.path.join(tw, name)))["epochs"][i][key]
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None
torch = {}
try:
    for line in filter(str.strip, open(os.path.join(tw, "torch.jsonl"))):
        r = json.loads(line); torch[(r["model"], r["precision"])] = r["epoch_seconds"]
except (OSError, ValueError):
    pass
f = lambda v, spec: format(v, spec) if v is not None else format("-", ">" + spec.split(".")[0])
print(f"{'model':7s} {'prec':4s} {'legacy s':>8s} {'graph s':>8s} {'torch s':>8s} {'graph/torch':>11s} {'acc legacy':>10s} {'acc graph':>9s}")
for model in ("lenet", "simple"):
    for amp, prec in (("none", "fp32"), ("fp16", "fp16")):
        a, b, t = epoch(f"keel_{model}_{amp}.json", -1, "seconds"), epoch(f"keel_{model}_{amp}_graph.json", -1, "seconds"), torch.get((model, prec))
        print(f"{model:7s} {prec:4s} {f(a, '8.3f')} {f(b, '8.3f')} {f(t, '8.3f')} {f(b / t if b and t else None, '11.2f')} "
              f"{f(epoch(f'keel_{model}_{amp}.json', 0, 'test_accuracy'), '10.4f')} {f(epoch(f'keel_{model}_{amp}_graph.json', 0, 'test_accuracy'), '9.4f')}")
PY
        # The eager copies that leave the host free (eager_runtime.cc copy_async: uploads, copy_ within the card)
        # against copies that complete before they return, as before: LeNet fp32's second epoch either way.
        step "copies: keel train --model lenet --amp none, KEEL_EAGER_COPY=sync (each batch upload waits for the card)"
        KEEL_EAGER_COPY=sync run_timed 60 "$keel" train --model lenet --device "$train_device" --amp none --epochs 2 \
          --data "$gw/data" -o '' --no-quantize -q --histogram-bins 0 --log-every 0 2>&1 | grep -E '^epoch 2'
        "$py" -c 'import json,sys; print("  default (asynchronous copies): epoch 2", json.load(open(sys.argv[1]))["epochs"][-1]["seconds"], "s")' \
          "$gw/keel_lenet_none.json" 2>/dev/null || true
        step "cuDNN graph API: KEEL_EAGER_PROFILE=1 keel train --model lenet --amp none (host time per op)"
        KEEL_CUDNN_GRAPH=1 run_timed 60 env KEEL_EAGER_PROFILE=1 "$keel" train --model lenet --device "$train_device" \
          --amp none --epochs 2 --data "$gw/data" -o '' --no-quantize -q --histogram-bins 0 --log-every 0 2>&1 |
          awk '/^eager profile of epoch 2/ {on = 1} on && n < 14 {print; n++}'
      fi
      if [[ -f "$work/models/resnet18/model.onnx" ]]; then
        for prec in fp32 fp16; do
          for g in 0 1; do
            step "cuDNN graph API: keel bench resnet18 batch 1 $prec, KEEL_CUDNN_GRAPH=$g"
            KEEL_CUDNN_GRAPH=$g run_timed 30 "$keel" bench "$work/models/resnet18/model.onnx" --device cuda \
              --precision "$prec" --warmup 10 --iters 100 2>&1 | grep -E '^(latency|cpu)|graph API is not used' | head -4
          done
        done
      fi
    fi
    if want bench; then
      step "benchmark: PyTorch eager on the GPU"
      rm -f "$work/torch.jsonl" "$work/keel.jsonl"
      run_timed 100 "$py" "$torch_bench" --peers "$peers" --models "${bench_models// /,}" --batches 1,64 \
        --precisions fp32,fp16 --warmup 10 --iters 50 --max-seconds 4 --json > "$work/torch.jsonl" || fail
      cat "$work/torch.jsonl"
      for m in $bench_models; do
        for b in 1 64; do
          for prec in fp32 fp16; do
            step "benchmark: keel $m batch $b $prec"
            pflag=(); [[ $prec == fp16 ]] && pflag=(--precision fp16)
            mp="$work/models/$m/model.onnx"; [[ $b -eq 64 ]] && mp="$work/models/b64/$m/model.onnx"
            if run_timed 30 "$keel" bench "$mp" --device cuda "${pflag[@]}" \
                 --warmup 5 --iters 50 --max-seconds 4 --json > "$work/keel_one.json"; then
              "$py" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(json.dumps({"model":sys.argv[2],"batch":int(sys.argv[3]),"precision":sys.argv[4],"median_ms":j["median_ms"],"throughput_per_s":j["throughput_per_s"],"fallbacks":j.get("fallbacks",0),"memory":j.get("memory",{})}))' \
                "$work/keel_one.json" "$m" "$b" "$prec" | tee -a "$work/keel.jsonl"
            else
              fail
            fi
          done
        done
      done
      step "Keel vs PyTorch eager on $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
      "$py" - "$work/keel.jsonl" "$work/torch.jsonl" <<'PY'
import json, sys
def load(p):
    out = {}
    try:
        lines = [l for l in open(p) if l.strip()]
    except OSError:
        return out
    for l in lines:  # a partial or non-JSON line (a run cut short) costs that line, not the table
        try:
            r = json.loads(l)
            out[(r["model"], r["batch"], r["precision"])] = r
        except (ValueError, KeyError, TypeError):
            pass
    return out
k, t = load(sys.argv[1]), load(sys.argv[2])
print(f"{'model':16s} {'batch':>5s} {'prec':4s} {'keel ms':>9s} {'torch ms':>9s} {'keel/s':>10s} {'torch/s':>10s} {'ratio':>6s}  target")
met = total = 0
for key in sorted(set(k) | set(t), key=lambda x: (x[0], x[1], x[2] != "fp32")):
    kr, tr = k.get(key), t.get(key)
    km = f"{kr['median_ms']:9.3f}" if kr else f"{'-':>9s}"
    tm = f"{tr['median_ms']:9.3f}" if tr else f"{'-':>9s}"
    kt = f"{kr['throughput_per_s']:10.1f}" if kr else f"{'-':>10s}"
    tt = f"{tr['throughput_per_s']:10.1f}" if tr else f"{'-':>10s}"
    ratio = kr["throughput_per_s"] / tr["throughput_per_s"] if kr and tr and tr["throughput_per_s"] > 0 else None
    target = ""
    if key[1] == 64 and key[2] == "fp16":
        target = ">= 1.10x"
        need = 1.10
    elif key[1] == 1:
        target = "latency <= torch"
        need = 1.0
    else:
        need = None
    if need is not None:
        total += 1
        ok = ratio is not None and ratio >= need
        met += ok
        target += "  met" if ok else "  MISSED"
    print(f"{key[0]:16s} {key[1]:5d} {key[2]:4s} {km} {tm} {kt} {tt} {(f'{ratio:6.2f}' if ratio else '     -')}  {target}")
print(f"targets met: {met}/{total} (ratio = Keel throughput / PyTorch eager throughput)")
PY
    fi
    if want profile; then
      # Where the time goes, for the next round of work: the second epoch's eager ops by kernel and shapes (host
      # time: launches, casts, allocations; then each op's time on the card) for the training runs, and ResNet-18's
      # nodes on the card.
      pw="$work/train/data"
      if [[ ! -f "$pw/train-images-idx3-ubyte" ]]; then
        step "profile: no training data (run the train step first)"
      else
        # 1: host CPU time per op (launch cost); sync: wall time per op with the card waited for before and after.
        for run in "lenet none 1" "lenet none sync" "lenet fp16 sync" "simple fp16 sync"; do
          set -- $run
          step "profile: KEEL_EAGER_PROFILE=$3 keel train --model $1 --amp $2 --device $train_device --epochs 2"
          run_timed 60 env KEEL_EAGER_PROFILE="$3" "$keel" train --model "$1" --device "$train_device" --amp "$2" --epochs 2 \
            --data "$pw" -o '' --no-quantize -q --histogram-bins 0 --log-every 0 2>&1 |
            awk '/^eager profile of epoch 2/ {on = 1} on && n < 40 {print; n++}'
        done
      fi
      if [[ -f "$work/models/resnet18/model.onnx" ]]; then
        step "profile: keel bench resnet18 --device cuda --profile"
        run_timed 30 "$keel" bench "$work/models/resnet18/model.onnx" --device cuda --warmup 5 --iters 30 \
          --profile --profile-nodes 12 2>&1 | tail -45
      fi
      if [[ -f "$work/models/b64/resnet18/model.onnx" ]]; then
        # Batch 64, where Keel trails PyTorch most: its slowest nodes in fp16, and fp32 with TF32 allowed (PyTorch's
        # cuDNN default) against true f32.
        step "profile: keel bench resnet18 batch 64 --precision fp16 --profile"
        run_timed 30 "$keel" bench "$work/models/b64/resnet18/model.onnx" --device cuda --precision fp16 --warmup 3 \
          --iters 20 --profile --profile-nodes 8 2>&1 | grep -E '^(latency|compute|  [A-Z]| +[0-9.]+ ms)' | head -30
        for tf32 in 0 1; do
          step "profile: keel bench resnet18 batch 64 fp32, KEEL_CUDA_TF32=$tf32"
          run_timed 30 env KEEL_CUDA_TF32=$tf32 "$keel" bench "$work/models/b64/resnet18/model.onnx" --device cuda \
            --warmup 3 --iters 20 2>&1 | grep -E '^(latency|compute)'
        done
      fi
    fi
    if [[ -n "${OUT:-}" || -n "$log" ]]; then  # the records beside the log, for the session to read whole
      rec="$(dirname "${log:-$OUT/x}")/gpu_check_records"
      mkdir -p "$rec"
      find "$work" -maxdepth 2 \( -name '*.json' -o -name '*.jsonl' -o -name '*.txt' \) -size -2M -exec cp {} "$rec/" \; 2>/dev/null
    fi
    failed_list=""
    for f in "${failed_steps[@]}"; do failed_list="${failed_list:+$failed_list; }$f"; done
    echo; echo "gpu_check: done in $(elapsed) s, ${#failed_steps[@]} failure(s)${failed_list:+ in: $failed_list}"
    [[ ${#failed_steps[@]} -eq 0 ]]
    ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
