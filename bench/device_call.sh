# Shared by the device-call scripts (bench/h200_session.sh, and a call's own script in docs/results/*/):
# sourced from the repo root, it sets out (the device tool's $OUT, where the logs go), rc_dir (the carried
# rapidcheck) and torch_flags (empty: a caller that builds the PyTorch op sets it), and defines log,
# call_header and build_tree.
out=${OUT:-/tmp/mok-out}
mkdir -p "$out"
rc_dir=$PWD/.deps/rapidcheck/usr/lib/x86_64-linux-gnu/cmake/rapidcheck
torch_flags=()

# A time-stamped line in summary.log and on the terminal.
log() { echo "== $(date -u +%T) $*" | tee -a "$out/summary.log"; }

# Starts summary.log: the commit ($MOK_COMMIT), the date, the device, nvcc, the MOK_* settings, then the
# caller's lines.
call_header() {
  {
    echo "commit: ${MOK_COMMIT:-unknown}"
    echo "date: $(date -u +%FT%TZ)"
    echo "device: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | head -1)"
    echo "nvcc: $(nvcc --version | tail -1)"
    env | grep '^MOK_' | grep -v '^MOK_COMMIT=' | sort | sed 's/^/env: /'  # the call's settings (MOK_BENCH_ARGS, ...)
    local line
    for line in "$@"; do echo "$line"; done
  } | tee "$out/summary.log"
}

# Configures the source tree $1 into $1/build with the call's flags and builds it with $2 jobs (further
# arguments go to cmake --build, e.g. --target).
build_tree() {
  local src=$1 jobs=$2
  shift 2
  cmake -S "$src" -B "$src/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -Drapidcheck_DIR="$rc_dir" "${torch_flags[@]}" &&
    cmake --build "$src/build" -j"$jobs" "$@"
}
