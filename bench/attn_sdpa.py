"""fsdpc's fused attention kernels on this CPU against PyTorch 2's scaled_dot_product_attention, in float32 and
bfloat16, forward and backward, causal (a GPT's attention).

usage: python3 bench/attn_sdpa.py [--shapes B,H,T,D ...] [--reps N] [--build DIR]

fsdpc's side is bench/attn_16.c (kernels/c's k_attention_f32 / k_attention_bf16 and their backward, as a
`--precision bf16` executable calls them), built here against DIR's kernel library (the x86-64-v4 one on a CPU
with AVX-512, else v3).  PyTorch's side is torch.nn.functional.scaled_dot_product_attention(q, k, v,
is_causal=True) on [B, H, T, D] tensors and its backward (what torch.compile and eager call for a GPT's
attention on a CPU: the flash kernel, in bf16 when the inputs are bf16).  Both at one thread, timed in CPU
seconds of their process (what load on a shared machine does not stretch); each repetition runs fsdpc's
binary once (every side) and then PyTorch's sides, the order of the two alternating.  Prints the best of the
repetitions per side and fsdpc's time over PyTorch's.  DNNL_MAX_CPU_ISA=AVX512_CORE_VNNI takes fsdpc's
widened bf16 path (a CPU without AVX512-BF16, as Intel Cascade Lake); PyTorch's side is not affected.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build(builddir, out):
    flags = open("/proc/cpuinfo").read()
    lib = "libfsdpc_kernels_v4.a" if " avx512f " in flags and " avx512bw " in flags else "libfsdpc_kernels_v3.a"
    blas = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
    exe = os.path.join(out, "attn_16")
    subprocess.run(["cc", "-O2", "-fopenmp", "-I" + os.path.join(ROOT, "kernels", "c"),
                    os.path.join(ROOT, "bench", "attn_16.c"), os.path.join(builddir, lib), "-L" + blas,
                    "-Wl,-rpath," + blas, "-lopenblas", "-ldnnl", "-lm", "-o", exe], check=True)
    return exe, lib, " avx512_bf16 " in flags


def fsdpc_once(exe, shape):
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run([exe] + [str(x) for x in shape] + ["1"], capture_output=True, text=True, check=True,
                         env=env).stdout
    got = {}
    for side in ("f32", "bf16"):
        m = re.search(r"^\s*%s\s+forward ([0-9.]+) / [0-9.]+\s+backward ([0-9.]+)" % side, out, re.M)
        got[side] = (float(m.group(1)), float(m.group(2)))
    return got


def torch_once(shape):
    """{side: (forward s, backward s)} of CPU time, PyTorch at one thread"""
    import torch
    import torch.nn.functional as F
    B, H, T, D = shape
    got = {}
    for side, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
        g = torch.Generator().manual_seed(1)
        q, k, v = [torch.randn(B, H, T, D, generator=g).to(dt).requires_grad_() for _ in range(3)]
        dy = torch.randn(B, H, T, D, generator=g).to(dt)
        t0 = time.process_time()
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t1 = time.process_time()
        y.backward(dy)
        t2 = time.process_time()
        got[side] = (t1 - t0, t2 - t1)
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["8,12,256,64", "8,12,1024,64"])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    a = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        exe, lib, native = build(a.build, tmp)
        print("CPU: %s; fsdpc kernels %s (%s); torch %s, 1 thread; CPU seconds, best of %d"
              % (cpu_name(), lib, "oneDNN limited to " + os.environ["DNNL_MAX_CPU_ISA"] if os.environ.get(
                  "DNNL_MAX_CPU_ISA") else "native bf16 GEMMs" if native else "bf16 widened to float32",
                 torch.__version__, a.reps))
        for s in a.shapes:
            shape = [int(x) for x in s.split(",")]
            torch_once([1, 1, 16, shape[3]])  # warm-up: the first call loads PyTorch's kernels
            best = {}
            for r in range(a.reps):
                runs = [("fsdpc", lambda: fsdpc_once(exe, shape)), ("torch", lambda: torch_once(shape))]
                for who, fn in (runs if r % 2 == 0 else runs[::-1]):
                    for side, tv in fn().items():
                        k = (who, side)
                        best[k] = tuple(min(x, y) for x, y in zip(best.get(k, tv), tv))
            print("B %d H %d T %d D %d, causal:" % tuple(shape))
            for side in ("f32", "bf16"):
                f, t = best[("fsdpc", side)], best[("torch", side)]
                print("  %-4s fsdpc forward %.4f s, backward %.4f s; torch SDPA %.4f, %.4f; fsdpc / torch: "
                      "forward %.2f, backward %.2f" % (side, f[0], f[1], t[0], t[1], f[0] / t[0], f[1] / t[1]))
            for who in ("fsdpc", "torch"):
                b16, b32 = best[(who, "bf16")], best[(who, "f32")]
                print("  %s bf16 / f32: forward %.2f, backward %.2f" % (who, b16[0] / b32[0], b16[1] / b32[1]))


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main())
