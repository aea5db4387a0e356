#!/usr/bin/env bash
# Install what fsdpc needs on Debian 12, only what is missing.  Idempotent.
#   scripts/setup.sh          build + run dependencies
#   scripts/setup.sh --test   also the test oracles (PyTorch, ONNX, NumPy) and clang + libFuzzer (fuzz_compile)
set -euo pipefail
pkgs=(cmake ninja-build gcc g++ binutils pkg-config libprotobuf-c-dev protobuf-c-compiler
      libopenmpi-dev openmpi-bin libopenblas-dev libopenblas-openmp-dev libdnnl-dev python3-numpy python3-onnx python3-matplotlib)
# --test: also iproute2 (the multihost test's network namespaces), Slurm (the slurm test starts its own
# slurmctld + slurmd) and ccache (scripts/test.sh's builds: install_minimal's second build tree hits it)
[ "${1:-}" = "--test" ] && pkgs+=(python3-torch python3-torchvision libonnx-testdata clang libclang-rt-14-dev
                                  iproute2 slurmctld slurmd slurm-client ccache)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The CUDA 13 toolkit (NVRTC, cuBLASLt, NCCL, cudart) is not a Debian
# package.  Without it fsdpc builds for --target cpu only (cmake warns too).
if ! [ -e /usr/local/cuda/lib64/libnvrtc.so ] && ! command -v nvcc >/dev/null; then
  echo "setup: warning: no CUDA 13 toolkit (NVRTC, cuBLASLt, NCCL, cudart under /usr/local/cuda): fsdpc will" \
       "build for --target cpu only and the cuda tests will be skipped; install it from NVIDIA for --target cuda" >&2
fi
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${#missing[@]} packages and what they need: ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  echo "setup: apt-get update (the package lists)"
  $SUDO apt-get update -qq
  # packages with daemons (slurmd, slurmctld, munge) are installed, not started: a policy-rc.d that denies
  # service starts for the length of the install, where the machine has none
  policy=""
  if ! [ -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# scripts/setup.sh: no service starts during its install\nexit 101\n' | $SUDO tee $policy >/dev/null
    $SUDO chmod 755 $policy
    trap '$SUDO rm -f $policy' EXIT
  fi
  # apt's progress as it goes, a line per package set up (its errors go to stderr as they are)
  echo "setup: apt-get install (downloading, then a line per package set up; minutes the first time)"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" |
    awk '/^(Need to get|After this operation|Setting up) / { print "  " $0; fflush() }'
  if [ -n "$policy" ]; then $SUDO rm -f $policy; trap - EXIT; fi
fi
