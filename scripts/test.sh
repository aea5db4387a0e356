#!/usr/bin/env bash
# The README's test command: install, build (Release, as a user builds it, and ASan+UBSan; warnings are
# errors in both), run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDPC_WERROR=ON >/dev/null
cmake --build build
(cd build && ctest --output-on-failure -j2 "$@")
# The sanitizer build runs the suites that read untrusted input and the runtime.
cmake -S . -B build-san -G Ninja -DFSDPC_SANITIZE=ON -DFSDPC_WERROR=ON >/dev/null
cmake --build build-san
(cd build-san && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j2 -L san "$@")
