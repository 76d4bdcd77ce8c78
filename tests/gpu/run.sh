#!/usr/bin/env bash
# One command for the GPU machine, from anywhere in the repo:  bash tests/gpu/run.sh
# Gets `deepinfer` and `gpu_tests` built with the CUDA backend, runs gpu_tests, then
# score_cuda_vs_cpu.sh. Everything goes to $OUT when set (run.log, gpu_tests.xml,
# score_cuda_vs_cpu.txt), else to build-gpu-run/out/.
#
# Where the binaries come from (first that applies):
#  1. DI_GPU_PREBUILT=1 or the device lacks our C++ dependencies, and build-gpu/bin.tar.xz is here:
#     the self-contained binaries that tests/gpu/build_portable.sh builds on the development machine
#     (carry build-gpu/bin.tar.xz to the device). They were compiled with that machine's absolute
#     paths for the test data, so /work/main is linked to this checkout when it does not exist.
#  2. The device has nlohmann-json, PCRE2, ICU and GoogleTest development files: a fresh CUDA build
#     here (CUDACXX, default /usr/local/cuda/bin/nvcc; Ninja when present, else Makefiles).
#  3. Neither: says what is missing and exits 2.
# The device image of this workplace (/work/.library/device/KINDS.md) lists nvcc, CMake and ninja
# but none of the Debian -dev packages, and has no network, so route 1 is the expected one.
# Env: DI_GPU_PREBUILT=1 (force 1), DI_GPU_BUILD=1 (force 2), DI_GPU_BUNDLE (another bundle path),
# GTEST_FILTER, DI_GPU_SEED (replay a printed seed), DI_GPU_TESTS_TIMEOUT (seconds for gpu_tests, default 480).
# gpu_tests holds every tests/gpu/*.cpp, among them the batch-invariant mode's bit-for-bit checks
# (batch_invariance_test.cpp, BatchInvariance.*; GTEST_FILTER='BatchInvariance.*' runs only them). A
# bundle built before that file existed lacks them: that is logged and fails the run.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT" || exit 2
DEST=${OUT:-$ROOT/build-gpu-run/out}
mkdir -p "$DEST"
LOG=$DEST/run.log
: >"$LOG"
log() { echo "[run.sh] $*" | tee -a "$LOG"; }
run_logged() { "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }

log "repo $ROOT, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
run_logged nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || log "nvidia-smi failed"
export CUDACXX=${CUDACXX:-/usr/local/cuda/bin/nvcc}
[[ -x $CUDACXX ]] || CUDACXX=$(command -v nvcc || echo "$CUDACXX")
log "nvcc: $("$CUDACXX" --version 2>/dev/null | tail -1 || echo absent)"
log "cmake: $(cmake --version 2>/dev/null | head -1 || echo absent); ninja: $(ninja --version 2>/dev/null || echo absent)"

# ---- what this machine has for a native build --------------------------------------------------
missing=()
have_header() { for d in /usr/include /usr/local/include; do [[ -e $d/$1 ]] && return 0; done; return 1; }
have_header nlohmann/json.hpp || missing+=("nlohmann-json3-dev")
pkg-config --exists libpcre2-8 2>/dev/null || have_header pcre2.h || missing+=("libpcre2-dev")
pkg-config --exists icu-uc 2>/dev/null || have_header unicode/utypes.h || missing+=("libicu-dev")
have_header gtest/gtest.h || missing+=("libgtest-dev")
command -v cmake >/dev/null || missing+=("cmake")
[[ -x $CUDACXX ]] || missing+=("nvcc")
((${#missing[@]})) && log "missing for a native build: ${missing[*]}"

BUNDLE=${DI_GPU_BUNDLE:-$ROOT/build-gpu/bin.tar.xz}
route=none
if [[ ${DI_GPU_BUILD:-0} == 1 ]]; then
  route=build
elif [[ ${DI_GPU_PREBUILT:-0} == 1 || ${#missing[@]} -gt 0 ]]; then
  [[ -f $BUNDLE ]] && route=bundle
else
  route=build
fi

case $route in
  bundle)
    BIN_DIR=$ROOT/build-gpu-run/bin
    rm -rf "$BIN_DIR" && mkdir -p "$BIN_DIR" && tar -C "$BIN_DIR" -xJf "$BUNDLE" || { log "cannot unpack $BUNDLE"; exit 2; }
    DEEPINFER=$BIN_DIR/deepinfer
    GPU_TESTS=$BIN_DIR/tests/gpu_tests
    log "prebuilt binaries from $BUNDLE ($(stat -c %y "$BUNDLE" | cut -d. -f1))"
    # gpu_tests reads DI_TEST_DATA, an absolute path of the machine that built it (/work/main/...).
    if [[ ! -e /work/main/tests/data && $ROOT != /work/main ]]; then
      mkdir -p /work && ln -sfn "$ROOT" /work/main && log "linked /work/main -> $ROOT (test data path)"
    fi
    ;;
  build)
    BUILD=$ROOT/build-gpu-native
    GEN="Unix Makefiles"
    command -v ninja >/dev/null && GEN=Ninja
    log "native build in $BUILD ($GEN)"
    run_logged cmake -S "$ROOT" -B "$BUILD" -G "$GEN" -DCMAKE_BUILD_TYPE=Release -DDEEPINFER_CUDA=ON || { log "configure failed"; exit 2; }
    run_logged cmake --build "$BUILD" -j"$(nproc)" --target deepinfer gpu_tests || { log "build failed"; exit 2; }
    DEEPINFER=$BUILD/deepinfer
    GPU_TESTS=$BUILD/tests/gpu_tests
    ;;
  *)
    log "no way to get binaries: $BUNDLE is absent${missing:+ and this machine lacks ${missing[*]}}."
    log "On the development machine run: bash tests/gpu/build_portable.sh, then carry build-gpu/bin.tar.xz."
    exit 2
    ;;
esac

# ---- tests ----------------------------------------------------------------------------------------
status=0
# (gtest reads GTEST_FILTER from the environment: unset it, so that a filter does not hide the tests asked about)
if ! env -u GTEST_FILTER "$GPU_TESTS" --gtest_list_tests 2>/dev/null | grep '^BatchInvariance\.' >/dev/null; then
  log "$GPU_TESTS has no BatchInvariance tests (built before tests/gpu/batch_invariance_test.cpp): rebuild it"
  status=1
fi
log "gpu_tests ${GTEST_FILTER:+(filter $GTEST_FILTER)}"
run_logged timeout "${DI_GPU_TESTS_TIMEOUT:-480}" "$GPU_TESTS" --gtest_output="xml:$DEST/gpu_tests.xml" ${GTEST_FILTER:+--gtest_filter="$GTEST_FILTER"}
rc=$?
log "gpu_tests exit $rc"
((rc)) && status=1

log "score_cuda_vs_cpu"
run_logged env OUT="$DEST" bash "$ROOT/tests/gpu/score_cuda_vs_cpu.sh" "$DEEPINFER" "$ROOT/tests"
rc=$?
log "score_cuda_vs_cpu exit $rc"
((rc)) && status=1

log "done: $([[ $status == 0 ]] && echo PASS || echo FAIL) (files in $DEST)"
exit $status
