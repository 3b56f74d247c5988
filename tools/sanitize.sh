#!/bin/sh
# The CPU tests under AddressSanitizer and UndefinedBehaviorSanitizer, CI-sized: configure and build
# BUILD_DIR (default build-asan), then ctest without the few tests too slow for a sanitized Debug
# build (below), about 10 minutes of tests on 2 cores. Any sanitizer report fails its test: ASan
# aborts, and -fno-sanitize-recover=undefined makes UBSan abort too.
#   tools/sanitize.sh [BUILD_DIR]          MOK_SANITIZE_JOBS=N for N parallel jobs (default 2)
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-asan}
jobs=${MOK_SANITIZE_JOBS:-2}

# Too slow sanitized (one to several minutes each; the plain Debug and Release runs keep them): fuzz
# campaigns with shrinking, the 400-case generator sweep, and the oracle check of a 448 x 320 layer.
slow='^(Driver\.SameSeedSameRun|Planted/FaultInjection\..*|Generators\.CasesAreValidAndCoverTheEdges'
slow="$slow|ReferenceVsOracleEdges\.ClampBranchFollowsTheLayersBf16H)\$"

cmake -S "$root" -B "$build" -G Ninja -DMOK_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_FLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
cmake --build "$build" -j "$jobs"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
ctest --test-dir "$build" -j "$jobs" --output-on-failure --timeout 300 -E "$slow"
