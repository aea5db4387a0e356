#!/usr/bin/env bash
# tests/gpu/run.sh — the cuda target on a real GPU, in two halves, because the
# GPU machine cannot build fsdpc (no protobuf-c, OpenBLAS or MPI there) and
# receives at most 64 MiB with a call:
#
#   tests/gpu/run.sh prepare OUTDIR   on a build machine: builds build/ (or
#       uses $FSDPC), compiles the check models (examples/gpt.onnx; a float32
#       ResNet-18 at 64x64, and the same in float64; the GPT also with
#       --precision bf16 and fp16) for
#       --target cuda and --target cpu, runs the CPU
#       reference and keeps its losses, compiles the benchmark models (a
#       GPT-2-small-shaped GPT, ResNet-18 at 224x224) for --target cuda, and
#       copies into OUTDIR what the run needs: executables, .init files
#       (xz-compressed when large; one per distinct set of weights), data,
#       manifest.json, the device layer's test,
#       and any shared library the executables need beyond libc, cuBLASLt and
#       NCCL (the executables, built for sm_90 only, gzipped).  OUTDIR inside the repository (e.g. build-gpu,
#       ignored by git) can then travel with the device tool's `carry`; prepare fails when OUTDIR and the
#       repository's tracked and not-ignored files exceed 56 MiB.  QUICK=1: small
#       benchmark shapes (to try prepare out).
#
#   tests/gpu/run.sh run OUTDIR       on the GPU machine, from the repository
#       root: finds libcublasLt.so.13 and libnccl.so.2 (the CUDA toolkit's
#       lib64, else PyTorch's nvidia-* wheels), then tests/gpu/gpu_run.py:
#       the device layer's test, the check models against the CPU losses
#       (FSDPC_NO_TF32=1, with and without CUDA Graphs, within 1e-4; TF32
#       reported), the benchmarks (CUDA Graph and eager) and PyTorch eager and
#       torch.compile on the same GPT, as one table.  Fits one 10-minute call
#       (GPU_RUN_BUDGET seconds, default 560).  Report, results and logs go to
#       OUTDIR and, when set, $OUT.  Exit 1 if a check failed.
#
#   tests/gpu/run.sh profile OUTDIR   on the GPU machine, the same setup, then
#       tests/gpu/gpu_profile.py: where the benchmark models' step time goes
#       (Nsight Compute's duration of every kernel of two eager steps, summed
#       by kernel), compute-sanitizer's memcheck of the check models, and
#       PyTorch's ResNet-18 on the benchmark's shape beside fsdpc's.
set -euo pipefail

usage() {
    echo "usage: tests/gpu/run.sh prepare OUTDIR | run OUTDIR | profile OUTDIR" >&2
    exit 2
}
[ $# -eq 2 ] || usage
mode=$1
outdir=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

# the system's own libraries (and those the GPU machine provides) never travel
system_lib() {
    case $1 in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | \
        libgcc_s.so.* | libstdc++.so.* | libcublasLt.so.* | libnccl.so.* | libcudart.so.*) return 0 ;;
    *) return 1 ;;
    esac
}

prepare() {
    local fsdpc=${FSDPC:-}
    if [ -z "$fsdpc" ]; then
        cmake -S . -B build -G Ninja >/dev/null
        cmake --build build
        fsdpc=build/fsdpc
    fi
    local help
    help=$("$fsdpc" --help 2>&1 || true)
    case $help in
    *"--target cuda"*) ;;
    *)
        echo "run.sh: $fsdpc has no --target cuda" >&2
        exit 1
        ;;
    esac
    mkdir -p "$outdir"
    local quick=()
    [ -n "${QUICK:-}" ] && quick=(--quick)
    /usr/bin/python3 tests/gpu/prep.py "$outdir" "$fsdpc" "${quick[@]}"
    if [ -x build/cuda_rt_dev_test ]; then
        cp build/cuda_rt_dev_test "$outdir/"
    else
        echo "run.sh: note: build/cuda_rt_dev_test is missing: the device layer's own test will not run"
    fi
    # shared libraries beyond the system's, cuBLASLt and NCCL
    mkdir -p "$outdir/lib"
    local exe lib path
    for exe in "$outdir"/gpt_check "$outdir"/resnet_check "$outdir"/gpt_bench "$outdir"/resnet_bench \
        "$outdir"/cuda_rt_dev_test; do
        [ -x "$exe" ] || continue
        while read -r lib _ path _; do
            system_lib "$lib" && continue
            if [ "$path" = "not" ]; then
                echo "run.sh: $exe needs $lib, which is not found here either" >&2
                exit 1
            fi
            [ -f "$path" ] && cp -L "$path" "$outdir/lib/"
        done < <(ldd "$exe" | grep '=>')
    done
    # the executables travel gzipped (6-7 MiB each, mostly kernel images: ~4x smaller); run unpacks them
    for exe in "$outdir"/*; do
        [ -f "$exe" ] && [ -x "$exe" ] || continue
        gzip -9f "$exe"
    done
    # what a device call carries: the working tree's tracked and not-ignored files, and OUTDIR (carried);
    # bytes, not disk blocks.  At most 56 MiB of the 64 a call may carry (41 MiB on 2026-11-28): room for what the tree gains.
    local size repo total limit=56
    size=$(du -sb --apparent-size "$outdir" | cut -f1)
    repo=$(git ls-files -z --cached --others --exclude-standard | du -cb --apparent-size --files0-from=- 2>/dev/null |
        tail -1 | cut -f1)
    total=$((size + repo))
    echo "run.sh: $outdir holds $((size >> 20)) MiB, the repository's files $((repo >> 20)) MiB: $((total >> 20)) MiB" \
        "travel (limit ${limit} MiB; a device call carries at most 64)"
    if [ "$total" -gt $((limit << 20)) ]; then
        echo "run.sh: $outdir and the repository are $((total >> 20)) MiB, over ${limit} MiB: build fewer models" \
            "(PREP_MODELS) or smaller GPT_BENCH / RESNET_BENCH shapes" >&2
        exit 1
    fi
    echo "run.sh: next, on the GPU machine: tests/gpu/run.sh run $outdir (carry $outdir)"
}

py_nvidia_dirs=()
# first directory holding $1: the toolkit, then Python's nvidia-* wheels
find_lib() {
    local d
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
        /usr/lib/x86_64-linux-gnu "${py_nvidia_dirs[@]}"; do
        if [ -e "$d/$1" ]; then
            echo "$d"
            return 0
        fi
    done
    return 1
}

# run SCRIPT: the setup both run and profile need, then tests/gpu/SCRIPT OUTDIR
run() {
    [ -f "$outdir/manifest.json" ] || {
        echo "run.sh: $outdir/manifest.json missing: run 'tests/gpu/run.sh prepare $outdir' on a build machine" >&2
        exit 1
    }
    local py=python3
    [ -x /opt/torch/.venv/bin/python3 ] && py=/opt/torch/.venv/bin/python3
    mapfile -t py_nvidia_dirs < <("$py" - <<'PY' 2>/dev/null || true
import glob, os, site
for r in site.getsitepackages() + [site.getusersitepackages()]:
    for d in sorted(set(glob.glob(os.path.join(r, "nvidia", "*", "lib")))):
        print(d)
PY
)
    local lt nccl
    lt=$(find_lib libcublasLt.so.13) || {
        echo "run.sh: libcublasLt.so.13 not found (CUDA toolkit or nvidia-cublas wheel)" >&2
        exit 1
    }
    nccl=$(find_lib libnccl.so.2) || {
        echo "run.sh: libnccl.so.2 not found (CUDA toolkit or nvidia-nccl wheel)" >&2
        exit 1
    }
    local outabs
    outabs=$(cd "$outdir" && pwd)
    export LD_LIBRARY_PATH="$outabs/lib:$lt:$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "run.sh: cuBLASLt from $lt, NCCL from $nccl; python $py"
    local exe missing z
    for z in "$outdir"/*.gz; do # the executables prepare gzipped (not the .init.gz files: gpu_run.py's)
        case $z in *.init.gz) continue ;; esac
        [ -e "${z%.gz}" ] || { gunzip -kf "$z" && chmod 755 "${z%.gz}"; }
    done
    for exe in "$outdir"/gpt_check "$outdir"/cuda_rt_dev_test; do
        [ -x "$exe" ] || continue
        missing=$(ldd "$exe" | grep 'not found' || true)
        if [ -n "$missing" ]; then
            echo "run.sh: $exe cannot load: $missing" >&2
            exit 1
        fi
    done
    nvidia-smi || true
    "$py" "tests/gpu/$1" "$outdir"
}

case $mode in
prepare) prepare ;;
run) run gpu_run.py ;;
profile) run gpu_profile.py ;;
*) usage ;;
esac
