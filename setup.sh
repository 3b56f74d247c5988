#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine (CUDA Toolkit 13 already installed, as on CI's and the GPU's
# machines), builds everything and runs the main job: the built-in golden check.
#   ./setup.sh            install + build + main job
#   MOK_NO_INSTALL=1 ./setup.sh   build + main job only (packages already there, e.g. the GPU machine)
set -euo pipefail
cd "$(dirname "$0")"

if [ -z "${MOK_NO_INSTALL:-}" ]; then
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  echo "== installing Debian packages"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    build-essential cmake ninja-build git clang-format \
    libeigen3-dev libgtest-dev googletest librapidcheck-dev libhdf5-dev zlib1g-dev python3-venv >/dev/null
  # A virtual environment: Debian's own python3 refuses system-wide pip installs (PEP 668).
  echo "== installing pinned PyPI packages into .venv (docs/golden-format.md's Python reader and its test)"
  python3 -m venv .venv
  .venv/bin/python3 -m pip install -q -r requirements.txt
fi

echo "== configuring and building (build/)"
python_hint=()
[ -x .venv/bin/python3 ] && python_hint=(-DPython3_EXECUTABLE="$PWD/.venv/bin/python3")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${python_hint[@]}" >/dev/null
cmake --build build -j"$(nproc)"

echo "== main job: the built-in golden check"
./build/golden/mok-golden check --builtin
