#!/usr/bin/env bash
# tools/gpu_check.sh — check Keel's CUDA plugin on an air-gapped GPU host (issue 8).
#
#   tools/gpu_check.sh bundle [--build DIR] [--out DIR] [--dry-run]
#       On the build machine: pack build/bin/keel (+ keel-cts when built), build/lib/libkeel.so*, the plugins
#       (build/lib/keel/plugins/*) and the Debian shared libraries they need (resolved with ldd; libc, libstdc++,
#       libm, libpthread, ld-linux and CUDA's own libraries excluded: the GPU host has those) plus the peers' model
#       generator (shared/peers/make_models.py) into gpu-bundle/ (git-ignored; no models). Prints its size; fails
#       above 60 MB.
#   tools/gpu_check.sh run [--bundle DIR] [--models a,b] [--work DIR] [--dry-run]
#       On the GPU host, from inside the bundle (or --bundle DIR): points the loader at the bundle's libraries and at
#       the nvidia-* wheels' libraries of the host python3, generates the models with make_models.py, runs
#       `keel plugins`, the device conformance suite on cuda (keel-cts), then `keel run --device cuda` on every
#       model against the PyTorch reference output (rtol 1e-3), and times cuda against cpu. Each step runs under
#       `timeout`; the whole run stays under 8 minutes. --dry-run prints the plan and the library path only.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
mode="${1:-}"
[[ $# -gt 0 ]] && shift
die() { echo "gpu_check: $*" >&2; exit 2; }
usage() { sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

case "$mode" in
  bundle)
    build="$repo/build"; out="$repo/gpu-bundle"; dry=0
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --build) build="${2:?--build DIR}"; shift 2 ;;
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
    [[ -f "$gen" ]] || die "make_models.py not found (../shared/peers/)"
    bins=("$build/bin/keel")
    [[ -x "$build/bin/keel-cts" ]] && bins+=("$build/bin/keel-cts")
    if [[ $dry -eq 1 ]]; then echo "would pack: ${bins[*]} $build/lib/libkeel.so* $build/lib/keel/plugins/* $gen -> $out"; exit 0; fi
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/lib/keel/plugins" "$out/deps" "$out/peers"
    cp -a "${bins[@]}" "$out/bin/"
    cp -a "$build"/lib/libkeel.so* "$out/lib/"
    cp -a "$build"/lib/keel/plugins/. "$out/lib/keel/plugins/"
    cp "$gen" "$out/peers/"
    cp "${BASH_SOURCE[0]}" "$out/gpu_check.sh"
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
    for f in "$out"/bin/* "$out"/lib/libkeel.so* "$out"/lib/keel/plugins/*.so "$out"/deps/*; do
      [[ -f "$f" && ! -L "$f" ]] && strip --strip-debug "$f" 2>/dev/null
    done
    size_kb=$(du -sk "$out" | cut -f1)
    echo "gpu_check: bundle $out: $((size_kb / 1024)) MB ($(ls "$out/deps" | wc -l) Debian libraries in deps/)"
    ls "$out/deps" | sed 's/^/  deps: /'
    [[ $size_kb -le $((60 * 1024)) ]] || die "bundle is over 60 MB"
    ;;

  run)
    bundle="$here"; models="simple_cnn,simple_cnn_b32,resnet18,mobilenet_v2,squeezenet1_1,transformer_enc"
    work="${TMPDIR:-/tmp}/keel-gpu-check"; dry=0
    while [[ $# -gt 0 ]]; do
      case "$1" in
        --bundle) bundle="${2:?--bundle DIR}"; shift 2 ;;
        --models) models="${2:?--models a,b}"; shift 2 ;;
        --work) work="${2:?--work DIR}"; shift 2 ;;
        --dry-run) dry=1; shift ;;
        -h|--help) usage; exit 0 ;;
        *) die "run: unknown argument '$1'" ;;
      esac
    done
    bundle="$(cd "$bundle" 2>/dev/null && pwd)" || die "no bundle folder"
    [[ -x "$bundle/bin/keel" ]] || die "no $bundle/bin/keel: pass --bundle DIR (a folder made by 'gpu_check.sh bundle')"
    py="${PYTHON:-python3}"
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
    export LD_LIBRARY_PATH="$bundle/lib:$bundle/deps${wheel_libs:+:$wheel_libs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    keel="$bundle/bin/keel"
    echo "gpu_check: bundle $bundle, models $models, work $work"
    echo "gpu_check: LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    if [[ $dry -eq 1 ]]; then
      echo "plan: make_models.py --out $work/models ${models//,/ }; keel plugins; keel-cts --device cuda;"
      echo "      per model: keel run --device cuda vs test_data_set_0/output_0.pb; keel run -n 20 on cuda and cpu"
      exit 0
    fi
    start=$(date +%s)
    fails=0
    mkdir -p "$work"
    step() { echo; echo "=== $1 ($(( $(date +%s) - start )) s)"; }
    step "generate models"
    timeout 180 "$py" "$bundle/peers/make_models.py" --out "$work/models" ${models//,/ } || { echo "make_models failed"; fails=$((fails+1)); }
    step "keel plugins"
    timeout 60 "$keel" plugins || fails=$((fails+1))
    if [[ -x "$bundle/bin/keel-cts" ]]; then
      step "device conformance suite on cuda"
      timeout 120 "$bundle/bin/keel-cts" --device cuda --kernel-prefix cuda_ || fails=$((fails+1))
    fi
    for m in ${models//,/ }; do
      d="$work/models/$m"
      [[ -f "$d/model.onnx" ]] || { echo "$m: no model"; fails=$((fails+1)); continue; }
      step "$m: cuda vs the PyTorch reference"
      rm -rf "$work/out_$m"; mkdir -p "$work/out_$m"
      if ! timeout 60 "$keel" run --device cuda -i "input=$d/test_data_set_0/input_0.pb" -o "$work/out_$m" --print 0 "$d/model.onnx"; then
        fails=$((fails+1)); continue
      fi
      "$py" - "$d/test_data_set_0/output_0.pb" "$work/out_$m/output_0.pb" <<'PY' || fails=$((fails+1))
import sys, numpy as np, onnx
from onnx import numpy_helper
def load(p):
    t = onnx.TensorProto(); t.ParseFromString(open(p, "rb").read()); return numpy_helper.to_array(t).astype(np.float64)
ref, out = load(sys.argv[1]), load(sys.argv[2])
err = np.abs(out - ref); tol = 1e-4 * max(1.0, np.abs(ref).max()) + 1e-3 * np.abs(ref)
ok = out.shape == ref.shape and bool((err <= tol).all())
print(f"  max abs err {err.max():.3e}, max |ref| {np.abs(ref).max():.3e}: {'OK' if ok else 'MISMATCH'} (rtol 1e-3)")
sys.exit(0 if ok else 1)
PY
      for dev in cuda cpu; do
        step "$m: timing on $dev"
        timeout 60 "$keel" run --device "$dev" -n 20 --warmup 3 --print 0 "$d/model.onnx" | tail -3 || true
      done
    done
    echo; echo "gpu_check: done in $(( $(date +%s) - start )) s, $fails failure(s)"
    [[ $fails -eq 0 ]]
    ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
