"""The rank's threads: the kernels, the step's fused loops and OpenBLAS on one OpenMP team, deterministic.

usage: threads.py FSDPC WORKDIR

A GPT (examples/gpt.py: d 64, 2 heads, T 64, vocab 256, batch 8; the attention scores and the MLP's GELU
are above the size where work is split: kernels.h's K_PAR_MIN) trains 4 AdamW steps:
- with OMP_NUM_THREADS=1 and =2, and twice more at 2: the losses, gradient norms and exported weights are
  bit-identical (elementwise and row kernels give each element the same arithmetic however the range is
  split; OpenBLAS's threads split C, not the sum);
- at world 2 under mpirun with 2 threads per rank = world 2 with 1 thread, bit for bit;
- the generated step (--emit-c) splits its big fused loops with `omp parallel for`, and the executable links
  the OpenMP build of OpenBLAS (ldd: .../openblas-openmp/libopenblas.so.0) and libgomp;
- the start-up line says how many threads each side got and why: "threads: 2 for the kernels, 2 for OpenBLAS
  (2 cores ...)" by default on a rank with the machine to itself (FSDPC's own sizing from the cores it may
  run on: taskset to one core gives 1 and 1), and names OMP_NUM_THREADS where that set them.
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from common import check, onnx_weights, run  # noqa: E402

STEPS = 4


def rows(path):
    return [(r["loss"], r["grad_norm"]) for r in map(json.loads, open(path)) if "step" in r]


def main():
    fsdpc, work = sys.argv[1:3]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    import torch
    from gpt import GPT, GPTConfig, export
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=64, block_size=64, dropout=0.0))
    export(copy.deepcopy(gpt), J("gpt.onnx"), 8, 64)
    np.random.default_rng(0).integers(0, 256, 64 * 64 + 1).astype("<u2").tofile(J("tokens.bin"))
    build = ["--target", "cpu", "--loss", "cross_entropy:logits,labels", "--wrap", "blocks"]
    exe = J("gpt")
    run([fsdpc, J("gpt.onnx"), "-o", exe, "--dim", "batch=8", "--emit-c"] + build)
    c = open(exe + ".c").read()
    n_par = len(re.findall(r'_Pragma\("omp parallel for', c))
    check(n_par >= 4, "the step splits %d fused loops across threads, expected the GPT's big ones (>= 4)" % n_par)
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    check(re.search(r"libopenblas\.so\.0 => \S*openblas-openmp/", ldd) and "libgomp" in ldd,
          "the executable should link the OpenMP OpenBLAS and libgomp:\n" + ldd)
    args = ["--tokens", J("tokens.bin"), "--steps", str(STEPS), "--lr", "1e-3", "--clip-grad-norm", "1e9"]

    def train(tag, env, argv=None, world=1):
        e = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
        e.update(env)
        cmd = (argv or []) + ([exe] if world == 1 else
                              ["mpirun", "--oversubscribe", "-np", str(world)] + (["-x", "OMP_NUM_THREADS"]
                                                                                   if "OMP_NUM_THREADS" in env else [])
                              + [exe])
        cmd += args + ["--metrics", J(tag + ".jsonl"), "--export-onnx", J(tag + ".onnx")]
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)
        check(p.returncode == 0, "%s: exit %d:\n%s" % (tag, p.returncode, p.stderr[-2000:]))
        return p.stdout, rows(J(tag + ".jsonl")), onnx_weights(J(tag + ".onnx"))

    def same(tag, a, b):
        check(a[1] == b[1], "%s: losses / grad norms %s, expected %s" % (tag, a[1], b[1]))
        for k in b[2]:
            check(np.array_equal(a[2][k], b[2][k]), "%s: weight %s differs" % (tag, k))

    one = train("t1", {"OMP_NUM_THREADS": "1"})
    check("threads: 1 for the kernels (OMP_NUM_THREADS), 1 for OpenBLAS (OMP_NUM_THREADS)" in one[0],
          "OMP_NUM_THREADS=1: the start-up line:\n" + one[0][:1500])
    cores = len(os.sched_getaffinity(0))
    for k in range(3):
        two = train("t2_%d" % k, {"OMP_NUM_THREADS": "2"})
        same("2 threads (run %d)" % (k + 1), two, one)
    dflt = train("default", {})
    want = "threads: %d for the kernels, %d for OpenBLAS (%d core" % (cores, cores, cores)
    check(want in dflt[0], "default threads: expected %r in:\n%s" % (want, dflt[0][:1500]))
    same("default threads", dflt, one)
    if shutil.which("taskset") and cores > 1:
        pinned = train("pinned", {}, ["taskset", "-c", "0"])
        check("threads: 1 for the kernels, 1 for OpenBLAS (1 core for this rank)" in pinned[0],
              "taskset -c 0: the start-up line:\n" + pinned[0][:1500])
        same("taskset -c 0", pinned, one)
    exe1 = exe
    exe = J("gpt_w2")
    run([fsdpc, J("gpt.onnx"), "-o", exe, "--dim", "batch=4"] + build)
    w2a = train("w2_t1", {"OMP_NUM_THREADS": "1"}, world=2)
    w2b = train("w2_t2", {"OMP_NUM_THREADS": "2"}, world=2)
    same("world 2, 2 threads per rank", w2b, w2a)
    exe = exe1
    print("threads: 1, 2 (three runs), default (%d cores)%s and world 2 x 2 threads: bit-identical; %d fused loops "
          "split" % (cores, ", taskset -c 0" if cores > 1 else "", n_par))


if __name__ == "__main__":
    main()
