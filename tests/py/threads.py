"""The rank's threads and the CPU it is built for: one OpenMP team, deterministic; fsdpc --cpu.

usage: threads.py FSDPC WORKDIR

A GPT (examples/gpt.py: d 64, 2 heads, T 64, vocab 256, batch 16, its MLP's activation QuickGELU, x sigmoid(1.702 x)
as CLIP's: elementwise nodes that stay fused loops, where the exact GELU is one Gelu node, passes/gelu.c; the
attention scores, the MLP's activation and the attention's Split copies and transposes are above the size where
work is split: kernels.h's K_PAR_MIN) trains 4 AdamW steps:
- with OMP_NUM_THREADS=1 and =2, and twice more at 2: the losses, gradient norms and exported weights are
  bit-identical (elementwise and row kernels give each element the same arithmetic however the range is
  split; OpenBLAS's threads split C, not the sum);
- at world 2 under mpirun with 2 threads per rank = world 2 with 1 thread, bit for bit;
- --precision bf16 and fp16: the forward and the backward one region each, every 16-bit GEMM call
  (k_matmul_bf16, k_matmul_add_bf16, k_matmul_add_rows_bf16) and the loss in a team run; bf16 with its GEMMs widened
  (DNNL_MAX_CPU_ISA=AVX512_CORE, as on a CPU without AVX512-BF16) 1 and 2 threads bit-identical (each widened
  tile's sgemm on one thread, whatever the team), and with oneDNN's native bf16 GEMM (AVX512-BF16) too (a block
  of rows keeps the whole call's bits: bench/gemmteam.c -DBF16);
- the generated step (--emit-c) splits its big fused loops (`omp parallel for`, or `omp for` in a team), runs
  the attention's Split copies and transposes in one team (k_share, a barrier between the copies and the
  transposes: at batch 16 they are large enough to split), the activation's fused loop and Mul in one, a LayerNorm's
  backward and a bias gradient's sum in one, a LayerNorm and the next MatMulAdd in one (the float32 GEMMs join
  the team: each thread its rows of C), the fused attention and its backward in one, a collective's Wait on the
  team's first thread then a barrier, the forward one region (its units' gathers and the loss's all-reduce in it)
  and the backward one (its units' gathers, reduce-scatters and their waits),
  and the executable links
  the OpenMP build of OpenBLAS (ldd: .../openblas-openmp/libopenblas.so.0) and libgomp;
- the start-up line says which library runs the float32 GEMMs and what start-up measured of each, kept per
  machine in the cache folder (a fresh folder keeps it, the next run reads it, a spoiled entry is measured again); FSDPC_GEMM=openblas
  and =onednn each say so and train within 1e-5 (the measured one's bits where it is that one); FSDPC_GEMM=mkl is
  one line and a non-zero exit;
- the start-up line says how many threads each side got and why: "threads: 2 for the kernels, 2 for OpenBLAS
  (2 cores ...)" by default on a rank with the machine to itself (FSDPC's own sizing from the cores it may
  run on: taskset to one core gives 1 and 1), and names OMP_NUM_THREADS where that set them;
- and how they wait: OMP_NUM_THREADS=3 under taskset -c 0 (oversubscribed) runs with OMP_WAIT_POLICY=passive
  set by the executable (it execs itself again; the line says so and why) and trains the same bits; a user's
  OMP_WAIT_POLICY=active is kept and named, FSDPC_WAIT=spin keeps libgomp's spinning; the default team (2 threads
  or more) names what the executable set: OMP_WAIT_POLICY=passive where the machine was busy at start-up, else
  GOMP_SPINCOUNT=1000 (a bounded spin, then sleep: a competitor arriving later finds the threads asleep).
--cpu (x86-64 machines):
- the default is native: the start-up line says "code for native, kernels for x86-64-vN", N this machine's
  level (from /proc/cpuinfo's flags);
- --cpu x86-64 and x86-64-v3 (where this CPU has it) build, say so, and train the native build's losses
  within 1e-4 (FMA contractions differ between levels), 1 and 2 threads bit-identical;
- a step compiled for a feature this CPU lacks (the C compiler given -mfma4, -mxop or -msse4a, whichever
  /proc/cpuinfo does not list: no CPU since 2017 has fma4) exits non-zero before running any of it, with one
  line naming the feature and --cpu;
- --cpu pentium and --cpu with --target cuda are one line each.
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

    class QuickGELU(torch.nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(1.702 * x)
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=256, n_layer=2, n_head=2, n_embd=64, block_size=64, dropout=0.0))
    for block in gpt.transformer.h:  # x sigmoid(1.702 x), CLIP's activation: exported as Mul, Sigmoid, Mul
        block.mlp.gelu = QuickGELU()
    export(copy.deepcopy(gpt), J("gpt.onnx"), 8, 64)
    np.random.default_rng(0).integers(0, 256, 64 * 64 + 1).astype("<u2").tofile(J("tokens.bin"))
    build = ["--target", "cpu", "--loss", "cross_entropy:logits,labels", "--wrap", "blocks"]
    exe = J("gpt")
    run([fsdpc, J("gpt.onnx"), "-o", exe, "--dim", "batch=16", "--emit-c"] + build)
    c = open(exe + ".c").read()
    n_par = len(re.findall(r'_Pragma\("omp (parallel for|for schedule\(static\) nowait)', c))
    check(n_par >= 4, "the step splits %d fused loops across threads, expected the GPT's big ones (>= 4)" % n_par)
    # runs of nodes in one team (codegen/team.c), each kernel its thread's share (k_share), a barrier where one
    # reads what another wrote; the bit-identical runs below check that the shares add up: the c_attn GEMM and
    # the fused attention reading q, k, v in place out of its output (passes/pack.c: no Split copies; a barrier
    # between, team.c taking the strided views' whole rows), the activation's
    # fused loop and Mul (`omp for nowait` in the team), a LayerNorm's backward and its bias gradient's sum
    runs = re.findall(r'_Pragma\("omp parallel"\)\n    \{ k_share\(1\);\n(.*?)k_share\(0\); \}', c, re.S)
    check("k_copy_strided" not in c and "&(const KAttnLd){" in c,
          "the step should read q, k, v out of c_attn's output (KAttnLd), with no copies (k_copy_strided)")
    check(any(re.search(r"k_matmul_add_f32\(t_h_\d+_attn_c_attn_Add_output_0.*?omp barrier.*?k_attention_f32\(", r, re.S)
              for r in runs),
          "the step should run the c_attn GEMM and the attention reading its output in one team with a barrier "
          "(%d runs):\n%s" % (len(runs), "\n".join(runs)[:1500]))
    check(any("k_binary_f32" in r and "omp for schedule(static) nowait" in r and "omp barrier" in r for r in runs),
          "the step should run the activation's fused loop and Mul in one team (%d runs)" % len(runs))
    check(any("k_layernorm_grad_f32" in r and "k_reduce_sum_to_f32" in r for r in runs),
          "the step should run a LayerNorm's backward and a bias gradient's sum in one team (%d runs)" % len(runs))
    # the float32 GEMMs join the team (each thread its rows of C): a LayerNorm and the MatMulAdd after it, with a
    # barrier between (the GEMM reads what the LayerNorm wrote)
    check(any(re.search(r"k_layernorm_f32\(.*omp barrier.*k_matmul_add_f32\(", r, re.S) for r in runs),
          "the step should run a LayerNorm and the MatMulAdd after it in one team (%d runs)" % len(runs))
    # the fused attention and its backward join the team too (each thread its units), and the collectives' starts
    # and waits (the step's thread starts or waits, not sharing; a barrier after a wait): the forward, its units'
    # gathers and the loss's all-reduce among it, is one region, and so is the backward (its units' gathers and
    # reduce-scatters, each reduce-scatter's wait and the gradient shard's sum after it)
    check(any("k_attention_f32(" in r for r in runs) and any("k_attention_grad_f32(" in r for r in runs),
          "the step should run the fused attention and its backward in a team (%d runs)" % len(runs))
    check(any(re.search(r'omp master"\)\n    \{ k_share\(0\);\n.*?rt_coll_wait\(.*?k_share\(1\); \}\n    _Pragma\("omp '
                        r'barrier"\)', r, re.S) for r in runs),
          "the step should wait for a collective in a team, on its first thread, then a barrier (%d runs)" % len(runs))
    for phase, end in (("forward", "backward"), ("backward", "optimizer")):
        text = c[c.index("static void %s(" % phase):c.index("static void %s(" % end)]
        check(text.count('_Pragma("omp parallel")') == 1 and "rt_coll_start" in text,
              "the %s should be one region (%d):\n%s" % (phase, text.count('_Pragma("omp parallel")'), text[-3000:]))
    ldd = subprocess.run(["ldd", exe], capture_output=True, text=True).stdout
    check(re.search(r"libopenblas\.so\.0 => \S*openblas-openmp/", ldd) and "libgomp" in ldd,
          "the executable should link the OpenMP OpenBLAS and libgomp:\n" + ldd)
    args = ["--tokens", J("tokens.bin"), "--steps", str(STEPS), "--lr", "1e-3", "--clip-grad-norm", "1e9"]
    # --trace at 2 threads: a node of a team run is marked where it ends (a barrier taken only when tracing), so
    # each GEMM node's time is its own: every one at least 1 us (the smallest, 16 x 64 rows by 64, is 8 MFLOP).
    # Marked at the run's end instead, every node of a run but its first took about 0 us.
    tr = J("trace.json")
    e = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    p = subprocess.run([exe, "--tokens", J("tokens.bin"), "--steps", "2", "--trace", tr, "--quiet"],
                       capture_output=True, text=True, env=e, timeout=300)
    check(p.returncode == 0, "--trace at 2 threads: exit %d:\n%s" % (p.returncode, p.stderr[-2000:]))
    gemms = [x for x in json.load(open(tr))["traceEvents"] if x["ph"] == "X" and x["tid"] == 0 and
             x["args"]["step"] == 2 and re.search(r"\((MatMul|MatMulAdd)\)$", x["name"])]
    check(len(gemms) >= 10 and min(x["dur"] for x in gemms) >= 1.0, "--trace at 2 threads: %d GEMM nodes, the "
          "shortest %.3f us: %s" % (len(gemms), min((x["dur"] for x in gemms), default=0),
                                    sorted((x["dur"], x["name"]) for x in gemms)[:4]))
    print("ok --trace at 2 threads: %d GEMM nodes of a step, each its own time (the shortest %.1f us)"
          % (len(gemms), min(x["dur"] for x in gemms)))

    def train(tag, env, argv=None, world=1):
        e = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                                "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "FSDPC_WAIT",
                                                                "OMPI_MCA_mpi_yield_when_idle")}
        e.update(env)
        cmd = (argv or []) + ([exe] if world == 1 else
                              ["mpirun", "--oversubscribe", "-np", str(world)]
                              + sum((["-x", v] for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS") if v in env), [])
                              + [exe])
        cmd += args + ["--metrics", J(tag + ".jsonl"), "--export-onnx", J(tag + ".onnx")]
        p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=300)
        check(p.returncode == 0, "%s: exit %d:\n%s" % (tag, p.returncode, p.stderr[-2000:]))
        return p.stdout, rows(J(tag + ".jsonl")), onnx_weights(J(tag + ".onnx"))

    def same(tag, a, b):
        check(a[1] == b[1], "%s: losses / grad norms %s, expected %s" % (tag, a[1], b[1]))
        for k in b[2]:
            check(np.array_equal(a[2][k], b[2][k]), "%s: weight %s differs" % (tag, k))

    def close(tag, a, b):
        """as same, within rounding: losses and grad norms 1e-5 relative, each weight within 1e-4 (a tenth of the
        learning rate: AdamW turns a rounding-level gradient difference into up to a whole step where a gradient
        changes sign; measured 1e-5 at most)"""
        check(len(a[1]) == len(b[1]) and all(abs(x - y) <= 1e-5 * abs(y) for p, q in zip(a[1], b[1])
                                              for x, y in zip(p, q)),
              "%s: losses / grad norms %s, expected within 1e-5 of %s" % (tag, a[1], b[1]))
        for k in b[2]:
            d = float(np.abs(a[2][k] - b[2][k]).max())
            check(d <= 1e-4, "%s: weight %s differs by up to %.3g" % (tag, k, d))

    one = train("t1", {"OMP_NUM_THREADS": "1"})
    check("threads: 1 for the kernels (OMP_NUM_THREADS), 1 for OpenBLAS (OMP_NUM_THREADS)" in one[0],
          "OMP_NUM_THREADS=1: the start-up line:\n" + one[0][:1500])
    blas = re.search(r"OpenBLAS's (\S+) kernels", one[0])
    check(blas, "the start-up line should name OpenBLAS's kernels:\n" + one[0][:1500])
    # OpenBLAS's AVX2 kernels ("Haswell", "Zen": OPENBLAS_CORETYPE=Haswell, as this project's Zen 5 machines set
    # it) sum differently on 2 threads than on 1 (measured: an sgemm of 512x64x192 differs in ~20 % of its
    # elements; its OpenMP build follows the team's size, OPENBLAS_NUM_THREADS=1 or not); its AVX-512 kernels do
    # not.  With those, runs on different team sizes are compared within rounding (close) and each team size's
    # runs with each other bit for bit.
    # The float32 GEMMs' library: measured at start-up unless FSDPC_GEMM names one (runtime/dev_host.c); oneDNN's
    # sgemm sums differently on 2 threads too (measured: 2048x256x1024 at 1 against 2 threads).
    # The choice is kept per machine in the cache folder (gemm-KEY): a fresh folder measures and keeps it, the
    # next run reads it, a spoiled entry is measured and written again; the suite's folder (tests/CMakeLists.txt)
    # holds one entry that every test's executables share, so no two runs of the suite differ by a probe's noise.
    gc = J("gemmcache")
    pat = (r"float32 GEMMs on (OpenBLAS|oneDNN) \((measured on one thread on this machine: oneDNN (\d+), OpenBLAS "
           r"(\d+) GFLOP/s), (kept in|from) (\S+?gemm-[0-9a-f]{16})[;)]")
    seen = []
    for tag, spoil in (("cache_new", None), ("cache_hit", None), ("cache_bad", "fsdpc-gemm-v1 onednn x\n")):
        if spoil:
            open(seen[0].group(6), "w").write(spoil)
        seen.append(re.search(pat, train(tag, {"OMP_NUM_THREADS": "1", "FSDPC_CACHE_DIR": gc})[0]))
        check(seen[-1], "%s: the start-up line should say which library runs the float32 GEMMs, what was measured "
              "and where it is kept" % tag)
    check([m.group(5) for m in seen] == ["kept in", "from", "kept in"] and seen[0].group(6).startswith(gc)
          and os.listdir(gc) == [os.path.basename(seen[0].group(6))] and seen[1].group(3, 4) == seen[0].group(3, 4),
          "the GEMM choice's cache: a fresh folder should keep it, the next run read it (the same rates), a spoiled "
          "entry be measured again: %s, folder %s" % ([m.group(0) for m in seen], os.listdir(gc)))
    lib = re.search(pat, one[0])
    check(lib, "the start-up line should say which library runs the float32 GEMMs and what it measured:\n"
          + one[0][:1500])
    sums_differ = blas.group(1) in ("Haswell", "Zen") or lib.group(1) == "oneDNN"
    across = close if sums_differ else same
    cores = len(os.sched_getaffinity(0))
    twos = []
    for k in range(3):
        twos.append(train("t2_%d" % k, {"OMP_NUM_THREADS": "2"}))
        across("2 threads (run %d)" % (k + 1), twos[-1], one)
        if k:
            same("2 threads, run %d against run 1" % (k + 1), twos[-1], twos[0])
    dflt = train("default", {})
    want = "threads: %d for the kernels, %d for OpenBLAS (%d core" % (cores, cores, cores)
    check(want in dflt[0], "default threads: expected %r in:\n%s" % (want, dflt[0][:1500]))
    (across if cores > 1 else same)("default threads", dflt, one)
    if shutil.which("taskset") and cores > 1:
        pinned = train("pinned", {}, ["taskset", "-c", "0"])
        check("threads: 1 for the kernels, 1 for OpenBLAS (1 core for this rank)" in pinned[0],
              "taskset -c 0: the start-up line:\n" + pinned[0][:1500])
        same("taskset -c 0", pinned, one)
    if shutil.which("taskset"):
        waiting(train, same)
    if cores > 1:  # a team: the executable set how it waits, passive where oversubscribed, else a bounded spin
        check("threads wait passively (set here: OMP_WAIT_POLICY=passive" in dflt[0] or
              "threads spin briefly, then sleep (set here: GOMP_SPINCOUNT=1000" in dflt[0],
              "default threads: the start-up line should say how the threads wait:\n" + dflt[0][:1500])
    forced = {}
    for name, word in (("openblas", "OpenBLAS"), ("onednn", "oneDNN")):
        forced[name] = train("lib_" + name, {"OMP_NUM_THREADS": "1", "FSDPC_GEMM": name})
        check("float32 GEMMs on %s (FSDPC_GEMM)" % word in forced[name][0],
              "FSDPC_GEMM=%s: the start-up line:\n%s" % (name, forced[name][0][:1500]))
        (same if word == lib.group(1) else close)("FSDPC_GEMM=" + name, forced[name], one)
    bad = subprocess.run([exe] + args, capture_output=True, text=True, env=dict(os.environ, FSDPC_GEMM="mkl"))
    check(bad.returncode != 0 and "FSDPC_GEMM=mkl: expected openblas or onednn" in bad.stderr
          and len(bad.stderr.strip().splitlines()) == 1, "FSDPC_GEMM=mkl: expected one line and a non-zero exit, "
          "got %d:\n%s" % (bad.returncode, bad.stderr[-1500:]))
    exe1 = exe
    exe = J("gpt_w2")
    run([fsdpc, J("gpt.onnx"), "-o", exe, "--dim", "batch=4"] + build)
    w2a = train("w2_t1", {"OMP_NUM_THREADS": "1"}, world=2)
    w2b = train("w2_t2", {"OMP_NUM_THREADS": "2"}, world=2)
    across("world 2, 2 threads per rank", w2b, w2a)
    # --precision bf16: its GEMMs take their thread's share in the step's teams as the float32 ones do (oneDNN's
    # bf16 GEMM rows of C or matrices of a batch, a MatMulAdd stored in bf16 each block's rows; widened, each
    # thread its tiles), and so do the loss and its gradient: the forward and the backward one region each.
    exe = J("gpt_bf16")
    run([fsdpc, J("gpt.onnx"), "-o", exe, "--dim", "batch=16", "--precision", "bf16", "--emit-c"] + build)
    c16 = open(exe + ".c").read()
    runs16 = re.findall(r'_Pragma\("omp parallel"\)\n    \{ k_share\(1\);\n(.*?)k_share\(0\); \}', c16, re.S)
    for kern in ("k_matmul_bf16(", "k_matmul_add_bf16(", "k_matmul_add_rows_bf16(", "k_cross_entropy_bf16("):
        check(any(kern in r for r in runs16) and kern not in re.sub(r'_Pragma\("omp parallel"\).*?k_share\(0\); \}',
                                                                      "", c16, flags=re.S),
              "bf16: every %s call should be in a team run (%d runs)" % (kern[:-1], len(runs16)))
    # and --precision fp16's (its GEMMs always widened): the forward and the backward one region each
    run([fsdpc, J("gpt.onnx"), "-o", J("gpt_fp16"), "--dim", "batch=16", "--precision", "fp16", "--emit-c"] + build)
    for prec, text16 in (("bf16", c16), ("fp16", open(J("gpt_fp16.c")).read())):
        for phase, end in (("forward", "backward"), ("backward", "optimizer")):
            text = text16[text16.index("static void %s(" % phase):text16.index("static void %s(" % end)]
            check(text.count('_Pragma("omp parallel")') == 1,
                  "%s: the %s should be one region (%d)" % (prec, phase, text.count('_Pragma("omp parallel")')))
    # With the GEMMs widened (oneDNN held below AVX512-BF16, as on a CPU without it): every GEMM's tiles, a
    # MatMulAdd's rows rounded to bf16 by the thread that computed them (k_matmul_add_rows_bf16), the Casts: the
    # same bits on 1 and 2 threads (each tile's sgemm on one thread, whichever; a lone tile's too)
    wide = {"DNNL_MAX_CPU_ISA": "AVX512_CORE"}
    b1 = train("bf16_t1", dict(wide, OMP_NUM_THREADS="1"))
    check("bf16 GEMMs: widened to float32" in b1[0], "bf16, widened: the start-up line:\n" + b1[0][:1500])
    same("bf16 widened, 2 threads against 1", train("bf16_t2", dict(wide, OMP_NUM_THREADS="2")), b1)
    # oneDNN's own bf16 GEMM where the CPU has AVX512-BF16 (else the widened path again): its GEMM gives a block of
    # rows the bits of the whole call and of one thread (bench/gemmteam.c -DBF16, the GPT step's shapes), so the
    # team's shares keep 1 thread's bits too
    n1 = train("bf16n_t1", {"OMP_NUM_THREADS": "1"})
    native = "bf16 GEMMs: native" in n1[0]
    same("bf16%s, 2 threads against 1" % (" native" if native else " (widened here)"),
         train("bf16n_t2", {"OMP_NUM_THREADS": "2"}), n1)
    exe = exe1
    print("threads: 1, 2 (three runs), default (%d cores)%s and world 2 x 2 threads: bit-identical; %d fused loops "
          "split; OpenBLAS's %s kernels, float32 GEMMs on %s (FSDPC_GEMM's each within 1e-5)%s"
          % (cores, ", taskset -c 0" if cores > 1 else "", n_par, blas.group(1), lib.group(1),
             ": GEMMs sum differently on 2 threads, so 1 against 2 threads within 1e-5, 2 against 2 bit for bit"
             if sums_differ else ""))
    print("threads: --precision bf16 and fp16: the forward and the backward one region each, the GEMMs in the "
          "teams; bf16 "
          "widened and %s GEMMs: 1 and 2 threads bit-identical" % ("oneDNN's native" if native else "(no native "
                                                                   "bf16 here) again widened"))
    cpu_levels(fsdpc, J, build, train, same, one, dflt, across)


def waiting(train, same):
    """3 threads on one core: the executable execs itself again with OMP_WAIT_POLICY=passive and says why, unless
    the user set OMP_WAIT_POLICY (or FSDPC_WAIT=spin); the same bits however the threads wait"""
    pin = ["taskset", "-c", "0"]
    over = train("over", {"OMP_NUM_THREADS": "3"}, pin)
    want = "threads wait passively (set here: OMP_WAIT_POLICY=passive, MPI yielding when idle; 3 threads on 1 core;"
    check(want in over[0], "3 threads on 1 core: expected %r in:\n%s" % (want, over[0][:1500]))
    user = train("over_user", {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "active"}, pin)
    same("3 threads on 1 core, passive against active", over, user)
    want = "threads wait as set (OMP_WAIT_POLICY=active, GOMP_SPINCOUNT=unset)"
    check(want in user[0] and "passive" not in user[0], "OMP_WAIT_POLICY=active: expected %r in:\n%s"
          % (want, user[0][:1500]))
    spin = train("over_spin", {"OMP_NUM_THREADS": "3", "FSDPC_WAIT": "spin"}, pin)
    check("threads spin briefly while they wait (FSDPC_WAIT=spin)" in spin[0],
          "FSDPC_WAIT=spin: the start-up line:\n" + spin[0][:1500])
    print("waiting: 3 threads on 1 core wait passively (the same bits as OMP_WAIT_POLICY=active, kept), "
          "FSDPC_WAIT=spin kept too")


def cpu_levels(fsdpc, J, build, train, same, native, native_out, across):
    flags = set()
    for line in open("/proc/cpuinfo"):
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    bad = subprocess.run([fsdpc, J("gpt.onnx"), "-o", J("x"), "--cpu", "pentium"] + build, capture_output=True,
                         text=True)
    check(bad.returncode != 0 and len(bad.stderr.strip().splitlines()) == 1 and "--cpu" in bad.stderr
          and "x86-64-v3" in bad.stderr, "--cpu pentium: %d %r" % (bad.returncode, bad.stderr))
    bad = subprocess.run([fsdpc, J("gpt.onnx"), "-o", J("x"), "--cpu", "native", "--target", "cuda", "--loss",
                          "cross_entropy:logits,labels"], capture_output=True, text=True)
    check(bad.returncode != 0 and "--cpu applies to --target cpu only" in bad.stderr,
          "--cpu with --target cuda: %d %r" % (bad.returncode, bad.stderr))
    if os.uname().machine != "x86_64":
        print("cpu levels: not an x86-64 machine, only --cpu native (checked above)")
        return
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "movbe", "xsave"} <= flags
    v4 = v3 and {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"} <= flags
    level = "x86-64-v4" if v4 else "x86-64-v3" if v3 else "x86-64"
    want = "code for native, kernels for %s" % level
    check(want in native_out[0], "native build: expected %r in the start-up line:\n%s" % (want, native_out[0][:1500]))
    for cpu in ["x86-64"] + (["x86-64-v3"] if v3 else []):
        tag = cpu.replace("-", "_")
        run([fsdpc, J("gpt.onnx"), "-o", J("gpt"), "--dim", "batch=16", "--cpu", cpu] + build)
        a = train(tag + "_t1", {"OMP_NUM_THREADS": "1"})
        b = train(tag + "_t2", {"OMP_NUM_THREADS": "2"})
        across("--cpu %s, 2 threads" % cpu, b, a)
        want = "code for %s, kernels for %s" % (cpu, cpu)
        check(want in a[0], "--cpu %s: expected %r in:\n%s" % (cpu, want, a[0][:1500]))
        for (la, ga), (ln, gn) in zip(a[1], native[1]):
            check(abs(la - ln) <= 1e-4 * abs(ln) and abs(ga - gn) <= 1e-4 * abs(gn),
                  "--cpu %s: loss %r grad norm %r, native %r %r" % (cpu, la, ga, ln, gn))
    # GCC's flags imply others (-mfma4 and -mxop imply -msse4a): try the one that implies least first, and
    # expect the message to name exactly the implied features this CPU lacks (AMD has sse4a, Intel has none)
    implies = {"-msse4a": ["sse4a"], "-mfma4": ["fma4", "sse4a"], "-mxop": ["xop", "fma4", "sse4a"]}
    lacking = [(f, m) for f, m in [("sse4a", "-msse4a"), ("fma4", "-mfma4"), ("xop", "-mxop")] if f not in flags]
    if not lacking:
        print("cpu levels: this CPU has fma4, xop and sse4a: the refusal is not exercised here")
        return
    feat, mflag = lacking[0]
    expect = {f for f in implies[mflag] if f not in flags}
    cc = J("cc_" + feat)
    with open(cc, "w") as f:
        f.write('#!/bin/sh\nexec cc %s "$@"\n' % mflag)
    os.chmod(cc, 0o755)
    run([fsdpc, J("gpt.onnx"), "-o", J("gpt_" + feat), "--dim", "batch=16", "--cc", cc] + build)
    p = subprocess.run([J("gpt_" + feat), "--tokens", J("tokens.bin"), "--steps", "1"], capture_output=True,
                       text=True, timeout=120)
    name = feat.replace("_", "")
    lines = p.stderr.strip().splitlines()
    named = set(re.search(r"lacks ([a-z0-9. ]+):", lines[0]).group(1).split()) if len(lines) == 1 and \
        re.search(r"lacks ([a-z0-9. ]+):", lines[0]) else set()
    check(p.returncode not in (0, -4) and len(lines) == 1 and name in named and named == expect
          and "--cpu" in lines[0] and "step 1" not in p.stdout,
          "a step built with %s: exit %d, expected one line naming %s (this CPU lacks %s of what it implies):\n%s"
          % (mflag, p.returncode, name, " ".join(sorted(expect)), p.stderr))
    print("cpu levels: native = %s kernels; x86-64%s train native's losses (1e-4), bit-identical at 1 and 2 "
          "threads; built with %s: refused at start (%s)" % (level, " and x86-64-v3" if v3 else "", mflag,
                                                                lines[0][:90]))


if __name__ == "__main__":
    main()
