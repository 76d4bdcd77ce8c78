#!/usr/bin/env bash
# The engine load test (tests/load) under AddressSanitizer + UndefinedBehaviorSanitizer (leaks
# included): builds only the load_tests target, CPU backend, in its own build directory next to the
# main one (DEEPINFER_ASAN_BUILD_DIR overrides), then runs it on fewer requests than the plain run
# (DEEPINFER_LOAD_REQUESTS, default 120 here) to keep CI time reasonable.
# usage: asan_load.sh <deepinfer> <repo>/tests
set -euo pipefail
TESTS=$(cd "$2" && pwd)
REPO=$(dirname "$TESTS")
BUILD=${DEEPINFER_ASAN_BUILD_DIR:-$REPO/build-asan}
mkdir -p "$BUILD"
cmake -S "$REPO" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEEPINFER_CUDA=OFF -DDEEPINFER_ASAN=ON \
  >"$BUILD/asan_configure.log" 2>&1 || { cat "$BUILD/asan_configure.log"; exit 1; }
cmake --build "$BUILD" -j"$(nproc)" --target load_tests >"$BUILD/asan_build.log" 2>&1 || { tail -50 "$BUILD/asan_build.log"; exit 1; }
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export DEEPINFER_LOAD_REQUESTS=${DEEPINFER_LOAD_REQUESTS:-120}
"$BUILD/tests/load_tests"
