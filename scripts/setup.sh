#!/usr/bin/env bash
# Install what fsdpc needs on Debian 12, only what is missing.  Idempotent.
#   scripts/setup.sh          build + run dependencies
#   scripts/setup.sh --test   also the test oracles (PyTorch, ONNX, NumPy) and clang + libFuzzer (fuzz_compile)
set -euo pipefail
pkgs=(cmake ninja-build gcc g++ binutils pkg-config libprotobuf-c-dev protobuf-c-compiler
      libopenmpi-dev openmpi-bin libopenblas-dev python3-numpy python3-onnx python3-matplotlib)
[ "${1:-}" = "--test" ] && pkgs+=(python3-torch python3-torchvision libonnx-testdata clang libclang-rt-14-dev)
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
  echo "setup: installing ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
