"""The bfloat16 GEMMs of fsdpc's --precision bf16 training step: widened into cblas_sgemm, or oneDNN's bf16 GEMM.

    /usr/bin/python3 bench/bf16_gemm.py [--threads 1,2] [--repeat 5] [--fsdpc build/fsdpc]
                                        [--sizes 128/4/128/8,256/6/256/8,512/8/256/8,768/12/1024/1]

For each GPT size of bench/gpt_cpu.py (d/L/T/B; torch 1.13 exports it, fsdpc compiles it with --precision bf16
--emit-c), the bfloat16 GEMMs of one training step are read from the generated step (every k_matmul_bf16 /
k_matmul_add_bf16 call: batch, strides, m, n, k, transposes, alpha).  bench/bf16_gemm.c, built here against the
kernels of fsdpc's build (the x86-64-v4 ones, as a `--cpu native` executable links on this machine), OpenBLAS's
OpenMP build and libdnnl, then times each distinct shape six ways in one process per size and thread count:
  widened   the operands widened block by block into float32 and cblas_sgemm (fsdpc's bf16 path before oneDNN);
  oneDNN    dnnl_gemm_bf16bf16f32 (AVX512-BF16 where the CPU has it; float32 accumulation);
  f32       k_matmul_f32 on float32 operands (the same GEMMs without mixed precision);
  team      fsdpc's widened path now (k_matmul_widened_16: C's tiles split across the team, each thread widening
            its own), what a CPU without AVX512-BF16 runs;
  whole     each operand widened once, whole, then one float32 GEMM (the alternative to the tiles);
  matmul    oneDNN's bf16 matmul primitive, made once per shape, only executed in the timed calls;
with OMP_NUM_THREADS and OPENBLAS_NUM_THREADS set to each --threads count.  Each repetition runs every side on
every shape, the order rotating (interleaved).  A side's step time is the sum over the step's calls of the
shape's best (and median) time; the table gives both, GFLOP/s of the best, and each side / f32 (--per-shape: each
shape's median too).  Set FSDPC_GEMM=onednn for the float32 GEMMs on oneDNN's sgemm (what an executable measures
and picks on this machine), BENCH_CLOCK=cpu to time by CPU time (a loaded machine), DNNL_MAX_CPU_ISA=AVX512_CORE
for a CPU without AVX512-BF16.  The result check (oneDNN against the widened path, and fsdpc's own k_matmul_bf16 against both) is the
largest |difference| over C relative to the largest sum_k |a b| of the shape: float32 rounding of the summation
order is ~1e-7 of that.
"""
import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
OPENBLAS = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
ap = argparse.ArgumentParser()
ap.add_argument("--threads", default="1,2")
ap.add_argument("--repeat", type=int, default=5)
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--sizes", default="128/4/128/8,256/6/256/8,512/8/256/8,768/12/1024/1", help="d/L/T/B,...")
ap.add_argument("--per-shape", action="store_true", help="also each shape's median time per side")
args = ap.parse_args()
sys.path.insert(0, HERE)
from step_gemms import step_gemms as bench_step_gemms  # noqa: E402

SIDES = ("widened", "onednn", "f32", "team", "whole", "matmul")


def step_gemms(fsdpc, work, d, L, T, B):
    """{(batch, sa, sb, m, n, k, ta, tb, alpha): calls} of one bf16 training step of the d/L/T/B GPT"""
    return bench_step_gemms(fsdpc, work, d, L, T, B, "bf16", ["--precision", "bf16"])


def build(root):
    build_dir = os.path.dirname(os.path.abspath(args.fsdpc))
    kernels = os.path.join(build_dir, "libfsdpc_kernels_v4.a")
    exe = os.path.join(root, "bf16_gemm")
    subprocess.run(["cc", "-O3", "-march=x86-64-v4", "-std=c11", "-fopenmp", "-I", os.path.join(HERE, "..", "kernels",
                    "c"), "-I", "/usr/include/x86_64-linux-gnu/openblas-openmp", "-o", exe,
                    os.path.join(HERE, "bf16_gemm.c"), kernels, "-L" + OPENBLAS, "-Wl,-rpath," + OPENBLAS,
                    "-lopenblas", "-ldnnl", "-lm"], check=True)
    return exe


def main():
    root = tempfile.mkdtemp(prefix="fsdpc-bf16gemm-")
    threads = [int(t) for t in args.threads.split(",")]
    sizes = [tuple(int(v) for v in s.split("/")) for s in args.sizes.split(",")]
    times = collections.defaultdict(list)  # (threads, size, side, shape) -> [seconds per repetition]
    checks = {}  # size -> worst (onednn vs widened, fsdpc vs widened, fsdpc vs onednn, team vs widened)
    shapes = {}
    try:
        exe = build(root)
        for size in sizes:
            work = os.path.join(root, "%d_%d_%d_%d" % size)
            os.makedirs(work)
            shapes[size] = step_gemms(args.fsdpc, work, *size)
            with open(os.path.join(work, "shapes.txt"), "w") as f:
                for s, c in sorted(shapes[size].items()):
                    f.write("%d %s %g\n" % (c, " ".join(str(v) for v in s[:-1]), s[-1]))
        for nt in threads:
            env = dict(os.environ, OMP_NUM_THREADS=str(nt), OPENBLAS_NUM_THREADS=str(nt))
            for size in sizes:
                out = subprocess.run([exe, os.path.join(root, "%d_%d_%d_%d" % size, "shapes.txt"), str(args.repeat)],
                                     env=env, check=True, capture_output=True, text=True).stdout
                for line in out.split("\n"):
                    w = line.split()
                    if w and w[0] == "t":
                        times[(nt, size, w[1], tuple(int(v) for v in w[3:11]))] = [float(v) for v in w[11:]]
                    elif w and w[0] == "check":
                        worst = checks.get(size, (0.0,) * 6)
                        checks[size] = tuple(max(x, float(y)) for x, y in zip(worst, w[8:14]))
                print("  threads %d, %s done" % (nt, "/".join(map(str, size))), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    for nt in threads:
        print("\nthreads %d, %d interleaved repetitions; step GEMM time, ms: best (median)\n" % (nt, args.repeat))
        print("| d/L/T/B | bf16 GEMMs per step (distinct shapes) | GFLOP | " +
              " | ".join("%s ms (GFLOP/s)" % s for s in SIDES) + " | " + " | ".join("%s / f32" % s for s in SIDES) + " |")
        print("|---" * (3 + 2 * len(SIDES)) + "|")
        for size in sizes:
            gflop = sum(c * 2.0 * s[0] * s[3] * s[4] * s[5] for s, c in shapes[size].items()) / 1e9
            best, med = {}, {}
            for side in SIDES:
                ts = [(times[(nt, size, side, s[:-1])], c) for s, c in shapes[size].items()]
                best[side] = sum(c * min(t) for t, c in ts)
                med[side] = sum(c * statistics.median(t) for t, c in ts)
            print("| %s | %d (%d) | %.2f | " % ("/".join(map(str, size)), sum(shapes[size].values()),
                                               len(shapes[size]), gflop) +
                  " | ".join("%.1f (%.1f) (%.0f)" % (1e3 * best[s], 1e3 * med[s], gflop / best[s]) for s in SIDES) +
                  " | " + " | ".join("%.2f (%.2f)" % (best[s] / best["f32"], med[s] / med["f32"]) for s in SIDES) +
                  " |")
            if args.per_shape:
                for s, c in sorted(shapes[size].items()):
                    print("    %dx %s: " % (c, s[:-1]) + ", ".join(
                        "%s %.3f" % (x, statistics.median(times[(nt, size, x, s[:-1])]) * 1e3) for x in SIDES) + " ms")
    print("\nresult check, worst over the shapes (max |diff| / max sum_k |a b|):")
    for size in sizes:
        print("  %s: oneDNN vs widened %.2g, fsdpc's k_matmul_bf16 vs widened %.2g, vs oneDNN %.2g, team vs widened "
              "%.2g, whole vs widened %.2g, matmul vs widened %.2g" % (
            "/".join(map(str, size)), *checks[size]))


if __name__ == "__main__":
    main()
