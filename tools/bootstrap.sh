#!/usr/bin/env bash
# Installs what is missing (Debian 12 packages), configures and builds Keel into ./build.
#   tools/bootstrap.sh [extra cmake -D options...]
# Environment: KEEL_BUILD_DIR (default: build), KEEL_JOBS (default: nproc).
set -euo pipefail
case ${1:-} in
  -h | --help) sed -n '2,4p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
esac
cd "$(dirname "$0")/.."

# ocl-icd-opencl-dev: Debian's oneDNN CMake config (dnnl-config.cmake) requires OpenCL, which libdnnl-dev only
# recommends; without it a fresh machine fails at configure ("Could NOT find OpenCL"). libgloo-dev: the CPU collective
# plugin (plugins/gloo); openmpi-bin: `mpirun` for the tests that start ranks the way Open MPI does.
# libcpp-httplib-dev: the HTTP client of the `keel serve` tests (the server parses with Boost.Beast, in libboost-dev);
# wrk: tools/serve_load.sh. clang-format: tools/check_format.sh. libssl-dev: SHA-256 of training run records (libcrypto).
packages=(
  build-essential cmake ninja-build ccache pkg-config clang-format
  libdnnl-dev ocl-icd-opencl-dev libtomlplusplus-dev libboost-dev libboost-filesystem-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata python3-onnx python3-numpy
  libcli11-dev libspdlog-dev nlohmann-json3-dev
  zlib1g-dev libssl-dev dataset-fashion-mnist
  libgloo-dev openmpi-bin
  libcpp-httplib-dev wrk
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ccache: key on paths relative to the checkout, so a fresh clone in another folder (CI) reuses earlier builds.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"

build_dir="${KEEL_BUILD_DIR:-build}"
jobs="${KEEL_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build "$build_dir" -j "$jobs"
