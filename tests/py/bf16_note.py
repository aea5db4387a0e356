"""--precision bf16 on a CPU without native bf16 GEMMs: the compiler and the executable say so, once each.

usage: bf16_note.py FSDPC WORKDIR

Where oneDNN has no native bfloat16 GEMM (below AVX512-BF16), the bf16 GEMMs of a --target cpu step run widened to
float32 (kernels/c/matmul_bf16.c); fsdpc (codegen/notes.c) and the executable at start (runtime/rt.c, rank 0) say so
in one line each.  Both ask oneDNN at run time, which DNNL_MAX_CPU_ISA=AVX512_CORE caps below AVX512-BF16, so
the test holds on CPUs with and without it:
  - forced (DNNL_MAX_CPU_ISA=AVX512_CORE): the compiler's note once; the executable's once at world 2 (rank 0
    only), with --quiet too; an fp32 build and its run say nothing;
  - as this machine is: the notes appear exactly where /proc/cpuinfo lacks avx512_bf16 (or AVX-512's base);
  - either way, a bf16 executable's start-up (stdout) says which bf16 GEMM it runs ("bf16 GEMMs: native ..." or
    "widened ..."); an fp32 one says nothing of it;
  - and which GEMM its MFU's peak was measured on: a bfloat16 one where the step's GEMMs are native bf16 (about
    twice float32's rate: against float32's peak a bf16 GPT printed MFU 153 %), else a float32 one.
"""
import os
import sys

import numpy as np

from common import mpirun, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FORCE = {"DNNL_MAX_CPU_ISA": "AVX512_CORE"}
COMPILER_NOTE = ("fsdpc: note: --precision bf16: no native bfloat16 GEMM on this CPU (AVX512-BF16): %s's bf16 GEMMs "
                 "run widened to float32 here, a step taking 0.9-1.0x the time of --precision fp32's")
RUN_NOTE = ("%s: note: no native bfloat16 GEMM on this CPU (AVX512-BF16): the bf16 GEMMs run widened to float32, a "
            "step taking 0.9-1.0x the time of --precision fp32's")


def native_here():
    """oneDNN's avx512_core_bf16: AVX-512 F, BW, VL, DQ and AVX512-BF16"""
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags |= set(line.split(":", 1)[1].split())
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"} <= flags


def notes(stderr):
    return [l for l in stderr.splitlines() if "bfloat16" in l]


def expect(what, stderr, want):
    got = notes(stderr)
    if got != want:
        raise SystemExit("FAILED: %s: expected %s, got:\n%s" % (what, want or "no note", stderr))
    print("ok %s: %s" % (what, "one note" if want else "no note"))


def peak_of(stdout, what, bf16):
    """the start-up's MFU line names the GEMM its peak was measured on: bfloat16 for native bf16 GEMMs"""
    want = "MFU against the peak measured here (a %s GEMM on this rank's threads" % ("bfloat16" if bf16 else "float32")
    line = [l for l in stdout.splitlines() if l.startswith("FLOPs per rank per step: ")]
    if len(line) != 1 or want not in line[0]:
        raise SystemExit("FAILED: %s: MFU line %r, expected one naming %r" % (what, line, want))
    return "%s: %s" % (what, "bfloat16" if bf16 else "float32")


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    J = lambda *a: os.path.join(work, *a)
    env = {k: v for k, v in os.environ.items() if k != "DNNL_MAX_CPU_ISA"}
    os.environ.clear()
    os.environ.update(env)  # "as this machine is" means no cap from the caller
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((16, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((16, 1)).astype(np.float32))
    model = os.path.join(ROOT, "examples", "mlp.onnx")
    flags = ["--target", "cpu", "--loss", "mse:y,target", "--dim", "batch=4"]
    data = ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--steps", "2"]
    bf16, fp32 = J("mlp_bf16"), J("mlp_fp32")

    # forced: below AVX512-BF16 whatever this CPU is
    p = run([fsdpc, model, "-o", bf16, "--precision", "bf16"] + flags, env=FORCE)
    expect("compiler, forced widened", p.stderr, [COMPILER_NOTE % bf16])
    p = run(mpirun(2, [bf16, "--quiet"] + data), env=FORCE)
    expect("executable at world 2 --quiet, forced widened", p.stderr, [RUN_NOTE % bf16])
    p = run([fsdpc, model, "-o", fp32] + flags, env=FORCE)
    expect("compiler, fp32, forced widened", p.stderr, [])
    p = run([fp32] + data, env=FORCE)
    expect("fp32 executable, forced widened", p.stderr, [])

    # as this machine is
    native = native_here()
    print("this CPU: %s" % ("AVX512-BF16 (native bf16 GEMMs)" if native else "no AVX512-BF16 (widened bf16 GEMMs)"))
    p = run([fsdpc, model, "-o", bf16, "--precision", "bf16"] + flags)
    expect("compiler, this CPU", p.stderr, [] if native else [COMPILER_NOTE % bf16])
    p = run([bf16] + data)
    expect("executable, this CPU", p.stderr, [] if native else [RUN_NOTE % bf16])
    # the start-up says which bf16 GEMM runs, either way (stdout; not under --quiet)
    line = [l for l in p.stdout.splitlines() if l.startswith("bf16 GEMMs: ")]
    want = "bf16 GEMMs: " + ("native (oneDNN" if native else "widened to float32")
    if len(line) != 1 or not line[0].startswith(want):
        raise SystemExit("FAILED: start-up line %r, expected one starting %r" % (line, want))
    peaks = [peak_of(p.stdout, "native" if native else "widened", native)]
    p = run([bf16] + data, env=FORCE)
    if "bf16 GEMMs: widened to float32" not in p.stdout:
        raise SystemExit("FAILED: forced widened: no start-up line:\n%s" % p.stdout)
    peaks.append(peak_of(p.stdout, "forced widened", False))
    p = run([fp32] + data)
    if "bf16 GEMMs" in p.stdout:
        raise SystemExit("FAILED: an fp32 run names bf16 GEMMs:\n%s" % p.stdout)
    peaks.append(peak_of(p.stdout, "fp32", False))
    print("ok the start-up line: %s; forced: widened; fp32: none" % line[0])
    print("ok MFU's peak: %s" % "; ".join(peaks))
    print("OK bf16_note: the widened-bf16 note from fsdpc and the executable (rank 0), forced and as this CPU is")


if __name__ == "__main__":
    main()
