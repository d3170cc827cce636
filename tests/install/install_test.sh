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
         lib/cmake/Keel/KeelConfig.cmake lib/cmake/Keel/KeelConfigVersion.cmake lib/pkgconfig/keel.pc; do
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
echo "PASS: install package (moved tree $P)"
