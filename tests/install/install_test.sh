#!/usr/bin/env bash
# install_test.sh BUILD_DIR SOURCE_DIR MAKE_MODEL CMAKE GENERATOR — see CMakeLists.txt beside it.
#
# 1. cmake --install BUILD_DIR --prefix T/stage; then the tree is moved to T/moved (T/stage no longer exists), so
#    anything that remembered the install prefix breaks here.
# 2. The examples are copied to T/src and configured in fresh build directories with only
#    CMAKE_PREFIX_PATH=T/moved: no access to the source tree's build, no package but Keel's.
# 3. The installed `keel` lists the installed plugins (found through <exe>/../lib/keel/plugins of the moved tree).
# 4. The vendor plugin (libkeel_sim.so + sim.keel-plugin.toml) goes into T/plugins, given through KEEL_PLUGIN_PATH.
# 5. host_app runs the generated model preferring "sim": MatMul/Add/Relu must run on sim, Sigmoid must fall back to
#    the CPU, and the outputs must equal a CPU-only run. `keel run --device sim` must agree.
# 6. `keel plugin-test` (the conformance kit) passes on the vendor plugin.
# 7. pkg-config: a C file built with `pkg-config --cflags --libs keel` of the moved tree runs.
# 8. The C++ training API: sdk/examples/train_cnn builds against keel::train alone (no libkeel.so in its NEEDED
#    libraries), trains on a small synthetic Fashion-MNIST-shaped IDX set with workers and bf16 autocast, saves a
#    checkpoint and an ONNX file that the installed `keel run` runs; keel::keel + keel::train in one target is a
#    CMake error; a program built with `pkg-config keel-train` runs; libkeel_train's RUNPATH is $ORIGIN. The same
#    program trains data-parallel as 2 ranks under the installed `keel launch` (Gloo): rank 0 alone reports, saves
#    and exports, and its model is as accurate.
set -euo pipefail
BUILD=$1 SRC=$2 MAKE_MODEL=$3 CMAKE=$4 GENERATOR=${5:-Ninja}
T=$(mktemp -d "${TMPDIR:-/tmp}/keel-install-test.XXXXXX")
trap 'rm -rf "$T"' EXIT
step() { echo "== $*"; }
die() { echo "FAIL: $*" >&2; exit 1; }

step "install into a prefix, then move the tree"
"$CMAKE" --install "$BUILD" --prefix "$T/stage" > "$T/install.log" || { cat "$T/install.log"; die "cmake --install"; }
mv "$T/stage" "$T/moved"
P=$T/moved
for f in include/keel/keel.h include/keel/plugin.h include/keel/keel.hpp lib/libkeel.so bin/keel \
         lib/cmake/Keel/KeelConfig.cmake lib/cmake/Keel/KeelConfigVersion.cmake lib/pkgconfig/keel.pc \
         include/keel/train.hpp include/keel/cxx/core/train/nn.h lib/libkeel_train.so lib/pkgconfig/keel-train.pc; do
  [ -e "$P/$f" ] || die "$f is not installed"
done
ls "$P"/lib/keel/plugins/*.keel-plugin.toml > /dev/null || die "no plugin manifest installed"
if grep -rl --include='*.cmake' --include='*.pc' --include='*.toml' "$T/stage" "$P" > /dev/null; then
  die "an installed file names the original prefix: $(grep -rl "$T/stage" "$P")"
fi

step "build the examples against the moved tree, in clean directories"
mkdir -p "$T/src"
cp -r "$SRC/sdk/examples/host_app" "$SRC/sdk/examples/vendor_plugin" "$T/src/"
for ex in host_app vendor_plugin; do
  "$CMAKE" -S "$T/src/$ex" -B "$T/build-$ex" -G "$GENERATOR" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
    > "$T/$ex.configure.log" 2>&1 || { cat "$T/$ex.configure.log"; die "configure $ex"; }
  "$CMAKE" --build "$T/build-$ex" > "$T/$ex.build.log" 2>&1 || { cat "$T/$ex.build.log"; die "build $ex"; }
done
HOST_APP=$T/build-host_app/host_app
[ -x "$HOST_APP" ] || die "host_app was not built"

step "the installed keel finds the installed plugins"
"$P/bin/keel" plugins > "$T/plugins.txt" 2>&1 || { cat "$T/plugins.txt"; die "keel plugins"; }
cat "$T/plugins.txt"
grep -q "$P/lib/keel/plugins" "$T/plugins.txt" || die "keel plugins does not list the moved tree's plugin directory"

step "drop the vendor plugin into a plugin directory"
mkdir -p "$T/plugins"
cp "$T/build-vendor_plugin/libkeel_sim.so" "$T/build-vendor_plugin/sim.keel-plugin.toml" "$T/plugins/"
export KEEL_PLUGIN_PATH=$T/plugins
"$P/bin/keel" plugins > "$T/plugins-sim.txt" 2>&1 || { cat "$T/plugins-sim.txt"; die "keel plugins (with sim)"; }
grep -E "^.*sim.*loaded" "$T/plugins-sim.txt" > /dev/null || { cat "$T/plugins-sim.txt"; die "sim is not loaded"; }

step "run a model partly on sim, the rest on the CPU"
"$MAKE_MODEL" "$T/model.onnx"
"$HOST_APP" "$T/model.onnx" --device sim --seed 7 > "$T/sim.txt" 2> "$T/sim.err" \
  || { cat "$T/sim.txt" "$T/sim.err"; die "host_app --device sim"; }
cat "$T/sim.txt"
grep -q "plugin sim: loaded" "$T/sim.txt" || die "host_app does not see sim loaded"
grep -q "plugin null: loaded" "$T/sim.txt" || die "host_app does not see the installed plugins (<libdir>/keel/plugins)"
for op in MatMul Add Relu; do
  grep -qE "^node .* \($op\) on sim " "$T/sim.txt" || die "$op did not run on sim"
done
grep -qE "^node .* \(Sigmoid\) on cpu " "$T/sim.txt" || die "Sigmoid did not run on the CPU"
grep -qE "^fallback .* \(Sigmoid\): sim -> cpu: " "$T/sim.txt" || die "the Sigmoid fallback was not reported"
grep -qE "^node .* \(Copy\) on " "$T/sim.txt" || die "no copies between sim and the CPU were inserted"
"$HOST_APP" "$T/model.onnx" --device cpu --seed 7 > "$T/cpu.txt" 2> "$T/cpu.err" \
  || { cat "$T/cpu.txt" "$T/cpu.err"; die "host_app --device cpu"; }
grep -qE "on sim" "$T/cpu.txt" && die "a CPU-only run placed something on sim"
diff <(grep '^output ' "$T/sim.txt") <(grep '^output ' "$T/cpu.txt") || die "sim and CPU outputs differ"
"$HOST_APP" "$T/model.onnx" --device sim --fallback error > "$T/strict.txt" 2>&1 && die "fallback=error accepted Sigmoid"
grep -q "Sigmoid" "$T/strict.txt" || { cat "$T/strict.txt"; die "fallback=error does not name the node"; }

step "keel run --device sim agrees"
"$P/bin/keel" --log-level info run "$T/model.onnx" --device sim > "$T/keel-run.txt" 2>&1 \
  || { cat "$T/keel-run.txt"; die "keel run --device sim"; }
grep -qi "falls back" "$T/keel-run.txt" || { cat "$T/keel-run.txt"; die "keel run reports no fallback"; }

step "keel plugin-test on the vendor plugin"
"$P/bin/keel" plugin-test "$T/plugins/sim.keel-plugin.toml" --model "$T/model.onnx" > "$T/kit.txt" 2>&1 \
  || { cat "$T/kit.txt"; die "keel plugin-test sim"; }
grep -E "^(Add|MatMul|Relu) " "$T/kit.txt"
grep -q "^PASS: plugin sim" "$T/kit.txt" || { cat "$T/kit.txt"; die "keel plugin-test did not pass"; }

step "pkg-config"
if command -v pkg-config > /dev/null && command -v cc > /dev/null; then
  export PKG_CONFIG_PATH=$P/lib/pkgconfig
  cc -std=c99 -Wall -Werror -pedantic "$SRC/tests/c_api/c_api_compile_test.c" $(pkg-config --cflags --libs keel) \
    -Wl,-rpath,"$P/lib" -o "$T/pc_test"
  "$T/pc_test"
else
  echo "(skipped: no pkg-config or cc)"
fi
step "the C++ training API: sdk/examples/train_cnn against keel::train"
readelf -d "$P"/lib/libkeel_train.so.0 | grep -E "(RUNPATH|RPATH).*\\\$ORIGIN" > /dev/null \
  || { readelf -d "$P"/lib/libkeel_train.so.0; die "libkeel_train.so has no RUNPATH \$ORIGIN"; }
cp -r "$SRC/sdk/examples/train_cnn" "$T/src/"
"$CMAKE" -S "$T/src/train_cnn" -B "$T/build-train_cnn" -G "$GENERATOR" -DCMAKE_PREFIX_PATH="$P" \
  -DCMAKE_BUILD_TYPE=Release > "$T/train_cnn.configure.log" 2>&1 || { cat "$T/train_cnn.configure.log"; die "configure train_cnn"; }
"$CMAKE" --build "$T/build-train_cnn" > "$T/train_cnn.build.log" 2>&1 || { cat "$T/train_cnn.build.log"; die "build train_cnn"; }
TRAIN_CNN=$T/build-train_cnn/train_cnn
needed=$(readelf -d "$TRAIN_CNN" | grep NEEDED)
echo "$needed" | grep -q "libkeel_train.so.0" || die "train_cnn does not link libkeel_train: $needed"
echo "$needed" | grep -qF "[libkeel.so" && die "train_cnn links libkeel.so as well as the training API (two cores): $needed"
# A small data set in Fashion-MNIST's layout (IDX, gzip): 640 train and 200 test images whose class is a bright band.
mkdir -p "$T/fmnist"
python3 - "$T/fmnist" <<'PY'
import gzip, random, struct, sys
random.seed(5)
def write(split, n):
    labels = [i % 10 for i in range(n)]
    images = bytearray()
    for c in labels:
        for r in range(28):
            for q in range(28):
                images.append(200 if 2 * c <= r < 2 * c + 6 else random.randrange(60))
    with gzip.open(f"{sys.argv[1]}/{split}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">IIII", 2051, n, 28, 28) + bytes(images))
    with gzip.open(f"{sys.argv[1]}/{split}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">II", 2049, n) + bytes(labels))
write("train", 640)
write("t10k", 200)
PY
(cd "$T" && env -u KEEL_PLUGIN_PATH "$TRAIN_CNN" --data "$T/fmnist" --epochs 2 --workers 2 --threads 1 --amp bf16 \
   --checkpoint "$T/cnn.safetensors" --onnx "$T/cnn.onnx") > "$T/train_cnn.txt" 2>&1 \
  || { cat "$T/train_cnn.txt"; die "train_cnn"; }
cat "$T/train_cnn.txt"
grep -q "^epoch 2/2: " "$T/train_cnn.txt" || die "train_cnn did not train two epochs"
acc=$(sed -n 's/.*Session test accuracy \([0-9.]*\).*/\1/p' "$T/train_cnn.txt")
[ -n "$acc" ] || die "train_cnn did not run its exported model"
python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" || die "the exported model's accuracy $acc < 0.9 on the band set"
[ -s "$T/cnn.safetensors" ] || die "no checkpoint"
"$P/bin/keel" --log-level error run "$T/cnn.onnx" --output-dir "$T/run-out" > "$T/keel-run-cnn.txt" 2>&1 \
  || { cat "$T/keel-run-cnn.txt"; die "keel run on train_cnn's ONNX"; }

step "the same program data-parallel: 2 ranks under the installed keel launch (Gloo)"
if [ -e "$P/lib/keel/plugins/gloo.keel-plugin.toml" ]; then
  (cd "$T" && env -u KEEL_PLUGIN_PATH timeout 300 "$P/bin/keel" launch --nproc-per-node 2 -- "$TRAIN_CNN" \
     --data "$T/fmnist" --epochs 2 --workers 1 --threads 1 --amp none --checkpoint "$T/cnn_dp.safetensors" \
     --onnx "$T/cnn_dp.onnx") > "$T/train_cnn_dp.txt" 2>&1 || { cat "$T/train_cnn_dp.txt"; die "train_cnn under keel launch"; }
  cat "$T/train_cnn_dp.txt"
  grep -q "^\[rank 0\] train_cnn: .*world size 2 (gloo)" "$T/train_cnn_dp.txt" || die "train_cnn did not run as 2 ranks"
  grep -q "^\[rank 0\] epoch 2/2: " "$T/train_cnn_dp.txt" || die "rank 0 did not train two epochs"
  grep -q "^\[rank 1\] epoch" "$T/train_cnn_dp.txt" && die "rank 1 printed epochs (rank 0 alone reports)"
  acc=$(sed -n 's/^\[rank 0\] exported.*Session test accuracy \([0-9.]*\).*/\1/p' "$T/train_cnn_dp.txt")
  [ -n "$acc" ] || die "rank 0 did not export and run the data-parallel model"
  python3 -c "import sys; sys.exit(0 if float('$acc') >= 0.9 else 1)" || die "the data-parallel model's accuracy $acc < 0.9"
  [ -s "$T/cnn_dp.safetensors" ] || die "no checkpoint from rank 0"
else
  echo "(skipped: the gloo plugin is not installed)"
fi

step "keel::keel and keel::train in one target is refused (one core per process)"
mkdir -p "$T/src/both"
cat > "$T/src/both/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(both CXX)
find_package(Keel REQUIRED COMPONENTS train)
file(WRITE ${CMAKE_BINARY_DIR}/main.cc "int main() { return 0; }\n")
add_executable(both ${CMAKE_BINARY_DIR}/main.cc)
target_link_libraries(both PRIVATE keel::keel keel::train)
CM
if "$CMAKE" -S "$T/src/both" -B "$T/build-both" -G "$GENERATOR" -DCMAKE_PREFIX_PATH="$P" > "$T/both.log" 2>&1; then
  die "a target linking keel::keel and keel::train was accepted"
fi
grep -q "KEEL_CORE_LIBRARY" "$T/both.log" || { cat "$T/both.log"; die "the refusal does not name KEEL_CORE_LIBRARY"; }

step "pkg-config keel-train"
if command -v pkg-config > /dev/null && command -v c++ > /dev/null; then
  export PKG_CONFIG_PATH=$P/lib/pkgconfig
  cat > "$T/pc_train.cc" <<'CC'
#include <keel/train.hpp>
#include <cstdio>
int main() {
  auto env = keel::train::init_runtime(1);
  if (!env.is_ok()) return 1;
  keel::train::nn::Linear fc(3, 2);
  auto x = keel::eager::ones({4, 3});
  keel::eager::sum(fc(x)).backward();
  std::printf("grad %s\n", fc.weight().grad().defined() ? "ok" : "missing");
  return fc.weight().grad().defined() ? 0 : 1;
}
CC
  c++ -std=c++20 -O1 "$T/pc_train.cc" $(pkg-config --cflags --libs keel-train) -Wl,-rpath,"$P/lib" -o "$T/pc_train"
  "$T/pc_train" | grep -q "grad ok" || die "the pkg-config keel-train program"
else
  echo "(skipped: no pkg-config or c++)"
fi
echo "PASS: install package (moved tree $P)"
