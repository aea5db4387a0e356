#!/usr/bin/env bash
# The README's test command: install, build (Release, as a user builds it, and ASan+UBSan; warnings are
# errors in both), run ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# ccache (setup.sh --test installs it): the install_minimal test's own build tree of the same sources and flags is
# then mostly cache hits instead of a third compile of fsdpc and the kernels
launch=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DFSDPC_WERROR=ON "${launch[@]}" >/dev/null
cmake --build build
# the build tree's cores.json: 2 slots for every core, every test one slot but those that mostly wait
# (CMakeLists.txt says why); ctest runs as many tests as there are slots, and 2 of the waiting ones beside them
slots=$(sed -n 's/.*"slots": *\([0-9]*\).*/\1/p' build/cores.json)
jobs=$((slots + 2))
(cd build && ctest --output-on-failure -j$jobs --resource-spec-file cores.json "$@")
# The sanitizer build runs the suites that read untrusted input and the runtime.
cmake -S . -B build-san -G Ninja -DFSDPC_SANITIZE=ON -DFSDPC_WERROR=ON "${launch[@]}" >/dev/null
cmake --build build-san
(cd build-san && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j$jobs --resource-spec-file cores.json -L san "$@")
