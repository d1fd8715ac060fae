#!/usr/bin/env bash
# Installs what is missing, then configures and builds myriad into build/ (executables in
# build/bin/).
#
#   scripts/setup.sh [--deps-dir DIR] [--build-dir DIR] [--build-type TYPE] [--jobs N]
#                    [--no-tests] [--configure-only] [-- extra cmake arguments]
#
# --configure-only stops after CMake: the build directory's compile_commands.json is all the caller
# needs (scripts/test.sh's include check).
#
# On Debian and Ubuntu, missing packages are installed with apt-get --no-install-recommends
# (as root, or through sudo). Elsewhere the script prints what to install and stops.
# A CUDA LibTorch from an installed PyTorch is preferred over Debian's CPU libtorch-dev.
#
# Offline GPU nodes: on a connected machine run scripts/fetch-offline-deps.sh DIR, copy DIR
# to the node, and run scripts/setup.sh --deps-dir DIR there. The .deb files are unpacked into
# a local prefix (MYRIAD_DEPS_PREFIX, default /tmp/myriad-deps) and the build uses them; no
# package manager runs.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
deps_dir=""
build_dir="$repo/build"
build_type=Release
# All cores, whatever OMP_NUM_THREADS (which nproc honours) a cluster shell sets.
jobs=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2>/dev/null || echo 2)
tests=ON
configure_only=0
extra_cmake=()

while [ $# -gt 0 ]; do
  case "$1" in
    --deps-dir) deps_dir=$(cd "$2" && pwd); shift 2 ;;
    --build-dir) build_dir=$2; shift 2 ;;
    --build-type) build_type=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --no-tests) tests=OFF; shift ;;
    --configure-only) configure_only=1; shift ;;
    --) shift; extra_cmake=("$@"); break ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    *) echo "setup.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "[setup] $*"; }

# Debian package names of everything myriad builds and runs against.
# libopenblas0-openmp replaces the reference BLAS that Debian's libtorch otherwise runs on (25x
# slower CPU matrix products), and follows OMP_NUM_THREADS.
debian_packages=(
  g++ cmake ninja-build pkg-config ccache
  libtorch-dev libopenblas0-openmp libopenmpi-dev openmpi-bin libhdf5-dev libboost-program-options-dev
  libgtest-dev nlohmann-json3-dev libturbojpeg0-dev libpng-dev zlib1g-dev hdf5-tools
  dataset-fashion-mnist
)
# What only the tests use: a private one-node Slurm (tests/e2e/slurm_requeue.sh), Python with
# h5py and PyTorch for writing and reading reference files independently of myriad, and ONNX's
# checker with OpenCV's DNN module as the independent readers of exported ONNX files
# (tests/e2e/onnx_export.sh), scikit-image with OpenCV as insightface's face alignment
# (tests/e2e/ijb_data.sh, tests/e2e/image_reference.sh), and scikit-learn's roc_curve as a second
# reference of IJB verification (tests/e2e/ijb_eval.sh).
test_packages=(slurm-wlm munge python3 python3-h5py python3-torch python3-onnx python3-opencv
               python3-skimage python3-sklearn)

torch_prefix_from_python() {
  command -v python3 >/dev/null 2>&1 || return 1
  python3 - <<'PY' 2>/dev/null
import torch
if torch.version.cuda is None:
    raise SystemExit(1)
print(torch.utils.cmake_prefix_path)
PY
}

install_missing_packages() {
  local missing=()
  local wanted=("${debian_packages[@]}")
  [ "$tests" = OFF ] || wanted+=("${test_packages[@]}")
  for p in "${wanted[@]}"; do
    # A CUDA PyTorch replaces Debian's CPU libtorch.
    if { [ "$p" = libtorch-dev ] || [ "$p" = libopenblas0-openmp ]; } && [ -n "$cuda_torch" ]; then continue; fi
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo=sudo; else
      echo "setup.sh: missing packages: ${missing[*]}; install them as root" >&2; exit 1
    fi
  fi
  log "installing: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

cuda_torch=$(torch_prefix_from_python || true)

cmake_args=(-DCMAKE_BUILD_TYPE="$build_type" -DMYRIAD_BUILD_TESTS="$tests")
prefix_path=()
if [ -n "$deps_dir" ]; then
  prefix=${MYRIAD_DEPS_PREFIX:-/tmp/myriad-deps}
  mkdir -p "$prefix"
  shopt -s nullglob
  debs=("$deps_dir"/*.deb)
  [ ${#debs[@]} -gt 0 ] || { echo "setup.sh: no .deb files in $deps_dir" >&2; exit 1; }
  for deb in "${debs[@]}"; do dpkg-deb -x "$deb" "$prefix"; done
  log "unpacked ${#debs[@]} packages from $deps_dir into $prefix"
  prefix_path+=("$prefix/usr")
  boost_dir=$(ls -d "$prefix"/usr/lib/*/cmake/Boost-* 2>/dev/null | head -n1 || true)
  [ -n "$boost_dir" ] && cmake_args+=(-DBoost_DIR="$boost_dir" -DBoost_NO_SYSTEM_PATHS=ON)
  export LD_LIBRARY_PATH="$(ls -d "$prefix"/usr/lib/*-linux-gnu | head -n1):${LD_LIBRARY_PATH:-}"
elif command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1; then
  install_missing_packages
else
  echo "setup.sh: not a Debian/Ubuntu system. Install: a C++17 compiler, CMake >= 3.22, LibTorch," >&2
  echo "  Open MPI (or another MPI), HDF5 (C), Boost.Program_options, GoogleTest, nlohmann-json," >&2
  echo "  libjpeg-turbo (turbojpeg) and zlib; then rerun with -- -DCMAKE_PREFIX_PATH=..." >&2
  command -v cmake >/dev/null 2>&1 || exit 1
fi

if [ -n "$cuda_torch" ]; then
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  log "using the CUDA LibTorch of the installed PyTorch: $cuda_torch"
  prefix_path+=("$cuda_torch")
  if command -v nvidia-smi >/dev/null 2>&1; then
    arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ')
    [ -n "$arch" ] && cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$arch")
  fi
fi
if [ ${#prefix_path[@]} -gt 0 ]; then
  cmake_args+=(-DCMAKE_PREFIX_PATH="$(IFS=';'; echo "${prefix_path[*]}")")
fi

generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
# Lets ccache reuse objects built with the precompiled header, and objects of another checkout
# of the repository (paths under it are hashed relative to it).
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$repo}

log "configuring $build_dir"
if [ -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build_dir" "${cmake_args[@]}" "${extra_cmake[@]}" >/dev/null
else
  cmake -S "$repo" -B "$build_dir" "${generator[@]}" "${cmake_args[@]}" "${extra_cmake[@]}"
fi
[ "$configure_only" = 0 ] || { log "configured (--configure-only): $build_dir"; exit 0; }
log "building with $jobs jobs"
cmake --build "$build_dir" -j "$jobs"
log "done: executables in $build_dir/bin"
