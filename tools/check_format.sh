#!/usr/bin/env bash
# Fails when any C++/CUDA file of the repository differs from clang-format's output (.clang-format).
#   tools/check_format.sh
set -euo pipefail
cd "$(dirname "$0")/.."
git ls-files -co --exclude-standard '*.h' '*.cpp' '*.cu' '*.cuh' | while read -r f; do [ -f "$f" ] && echo "$f"; done |
  xargs clang-format --dry-run --Werror
echo "clang-format: clean"
