"""The emulated cuda executable's operations: checkpoints, a dead or a stalled rank, too little device memory.

usage: cuda_emulate_ops.py FSDPC WORKDIR

fsdpc --target cuda --emulate (docs/cuda.md) runs the cuda executable's own
runtime (dev_cuda.c, comm_nccl.c, ctl_tcp.c) on the host's emulation of CUDA,
cuBLASLt and NCCL.  The model is the shipped MLP (examples/mlp.onnx, mse,
AdamW, --wrap size:600) on x.npy (48x16) and t.npy (48x1) from
default_rng(0), global batch 12, FSDPC_NO_TF32=1, as tests/py/checkpoint.py
checks the cpu target; executables: emulated cuda at world 2 and 1, cpu at
world 2.

1. Checkpoints (the format is the cpu target's: docs/checkpoints.md):
   reference: cuda world 2, 10 uninterrupted steps -> losses L, weights W.
   cuda world 2 --steps 6 --ckpt-every 4: steps 1-6 == L; DIR holds latest,
   step-00000004 and step-00000006, each with rank-00000.bin and
   rank-00001.bin.  --resume DIR at world 2: steps 7-10 == L and the exported
   weights == W, bit for bit (the CUDA Graph re-captured after the resume).
   --resume DIR/step-00000004 resharded to cuda world 1: steps 5-10 and the
   weights within 1e-6.  Across targets: the cpu target resumes the cuda
   checkpoint (steps 5-10 within 1e-5 of L, the emulated cuda's tolerance to
   cpu), and the cuda executable resumes a cpu checkpoint of step 4 (steps
   5-10 within 1e-5 of L, weights within 1e-5).  A rank killed while saving
   (FSDPC_FAULT=ckpt:1, rank 1 dies half way through its shard file of step
   7): the job fails, latest still names step 6, no step-00000007.
2. The watchdog with the emulated NCCL, ranks launched directly (RANK,
   WORLD_SIZE, --rendezvous file:), so that no launcher ends the job for
   them: rank 1 killed (SIGKILL) mid-run: rank 0 exits 1 with one error line
   naming rank 1 (its NCCL communicator's async error, polled by cu_wait, or
   the control plane's watchdog seeing the connection close: whichever comes
   first); rank 0 killed: rank 1 likewise names rank 0; rank 1
   stopped (SIGSTOP) mid-run with FSDPC_STEP_TIMEOUT=10: rank 0 exits 1 with
   one line "... did not finish within 10 s (FSDPC_STEP_TIMEOUT)", and rank 1,
   continued, exits non-zero too; rank 1 stopped before it starts, under
   mpirun with FSDPC_START_TIMEOUT=5: rank 0, inside MPI_Init of the
   rendezvous through MPI, exits 1 with one line naming it (start-up's guard,
   runtime/guard.c).  Each within 60 s (a hang would hit it).
3. Too little device memory (FSDPC_CUEMU_MEM_MIB): 350 MiB at world 1 and
   400 at world 2 (the emulated context takes 300): exit 1, exactly one error
   line, "needs X GiB of device memory (plan: ...), GPU 0 (...) has F GiB free
   of T GiB: use more ranks or a smaller --dim batch" with F and T those of
   the emulated device; 64 MiB (less than the context): exit 1, a line naming
   FSDPC_CUEMU_MEM_MIB and its least value.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from common import check, mpirun, onnx_weights, rel_err, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
GLOBAL_B, STEPS, INTERRUPT, EVERY = 12, 10, 6, 4
LIMIT = 60   # seconds; any run here takes a few: a hang fails the test
# FSDPC_STEP_TIMEOUT of the stalled-rank case: well above a step of the MLP under ASan on a loaded machine
STALL_TIMEOUT = 10
EMU = ["--target", "cuda", "--emulate"]


def step_name(s):
    return "step-%08d" % s


def tree_hashes(d):
    return {f: hashlib.sha256(open(os.path.join(d, f), "rb").read()).hexdigest() for f in sorted(os.listdir(d))}


class Mlp:
    """the MLP's executables (compiled on first use) and its runs"""

    def __init__(self, fsdpc, work):
        self.fsdpc, self.work, self.exes = fsdpc, work, {}
        rng = np.random.default_rng(0)
        np.save(self.path("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
        np.save(self.path("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
        self.data = ["--data", "x=" + self.path("x.npy"), "--data", "target=" + self.path("t.npy")]

    def path(self, *p):
        return os.path.join(self.work, *p)

    def exe(self, target, world):
        key = (target, world)
        if key not in self.exes:
            out = self.path("mlp_%s_w%d" % (target, world))
            run([self.fsdpc, os.path.join(ROOT, "examples", "mlp.onnx"), "-o", out, "--loss", "mse:y,target",
                 "--optimizer", "adamw", "--dim", "batch=%d" % (GLOBAL_B // world), "--wrap", "size:600", "--quiet"]
                + (EMU if target == "cuda" else ["--target", "cpu"]), timeout=LIMIT * 5)
            self.exes[key] = out
        return self.exes[key]

    def train(self, target, world, tag, extra, expect_ok=True, env=None):
        """one job; (process, losses by step, exported weights or None)"""
        m, o = self.path(tag + ".jsonl"), self.path(tag + ".onnx")
        argv = [self.exe(target, world)] + self.data + ["--lr", "1e-3", "--metrics", m, "--export-onnx", o,
                                                        "--quiet"] + extra
        try:
            p = run(mpirun(world, argv), check=expect_ok, env=env, timeout=LIMIT)
        except subprocess.TimeoutExpired:
            raise SystemExit("FAILED: %s: did not finish within %d s" % (tag, LIMIT))
        if p.returncode != 0:
            return p, {}, None
        rows = [json.loads(l) for l in open(m) if '"step"' in l]
        return p, {r["step"]: r["loss"] for r in rows}, onnx_weights(o)


def same(tag, got, want, first, tol, weights=None, want_w=None):
    """losses of steps first..STEPS (and weights) equal (tol None: bit for bit) or within tol"""
    check(sorted(got) == list(range(first, STEPS + 1)), "%s: steps %s, expected %d..%d" % (tag, sorted(got), first,
                                                                                          STEPS))
    for s, a in got.items():
        b = want[s]
        ok = a == b if tol is None else abs(a - b) <= tol * abs(b)
        check(ok, "%s step %d: loss %.9g, the uninterrupted cuda run's %.9g" % (tag, s, a, b))
    worst = 0.0
    for k, v in (want_w or {}).items():
        check(k in weights and weights[k].shape == v.shape, "%s: weight %s missing or reshaped" % (tag, k))
        e = rel_err(weights[k], v)
        check(e == 0 if tol is None else e <= tol, "%s: weight %s differs by %.3g" % (tag, k, e))
        worst = max(worst, e)
    return worst


def checkpoints(mlp):
    _, L, W = mlp.train("cuda", 2, "ref", ["--steps", str(STEPS)])
    check(sorted(L) == list(range(1, STEPS + 1)), "reference: steps %s" % sorted(L))
    print("reference   cuda world 2, %d steps: losses %s" % (STEPS, " ".join("%.6f" % L[s] for s in sorted(L))))
    D = mlp.path("D")
    _, got, _ = mlp.train("cuda", 2, "interrupted", ["--steps", str(INTERRUPT), "--ckpt-dir", D, "--ckpt-every",
                                                    str(EVERY)])
    check(all(got[s] == L[s] for s in got) and len(got) == INTERRUPT, "interrupted: losses %s, reference %s"
          % (got, L))
    check(sorted(os.listdir(D)) == ["latest", step_name(EVERY), step_name(INTERRUPT)], "%s holds %s" % (
        D, sorted(os.listdir(D))))
    for s in (EVERY, INTERRUPT):
        have = sorted(os.listdir(os.path.join(D, step_name(s))))
        check(have == ["consts.bin", "manifest", "rank-00000.bin", "rank-00001.bin", "run.toml"],
              "%s holds %s" % (step_name(s), have))
    D2 = mlp.path("D2")  # the resumed runs below save into D (its run.toml's --ckpt-dir): the fault's copy
    shutil.copytree(D, D2)
    _, got, w = mlp.train("cuda", 2, "resumed", ["--resume", D, "--steps", str(STEPS)])
    same("resumed", got, L, INTERRUPT + 1, None, w, W)
    print("resumed     cuda world 2 from %s (latest): steps %d-%d and weights == reference, bit for bit"
          % (step_name(INTERRUPT), INTERRUPT + 1, STEPS))
    src = os.path.join(D, step_name(EVERY))
    _, got, w = mlp.train("cuda", 1, "reshard_w1", ["--resume", src, "--steps", str(STEPS)])
    e = same("resharded to cuda world 1", got, L, EVERY + 1, 1e-6, w, W)
    print("resharded   cuda world 1 from %s: steps %d-%d within 1e-6, weights %.2g" % (step_name(EVERY), EVERY + 1,
                                                                                       STEPS, e))
    _, got, w = mlp.train("cpu", 2, "cpu_from_cuda", ["--resume", src, "--steps", str(STEPS)])
    e = same("the cpu target from the cuda checkpoint", got, L, EVERY + 1, 1e-5, w, W)
    print("cpu <- cuda the cpu target at world 2 resumes %s: steps %d-%d within 1e-5, weights %.2g"
          % (step_name(EVERY), EVERY + 1, STEPS, e))
    C = mlp.path("C")
    mlp.train("cpu", 2, "cpu_ckpt", ["--steps", str(EVERY), "--ckpt-dir", C])
    _, got, w = mlp.train("cuda", 2, "cuda_from_cpu", ["--resume", C, "--steps", str(STEPS)])
    e = same("the cuda target from the cpu checkpoint", got, L, EVERY + 1, 1e-5, w, W)
    print("cuda <- cpu the emulated cuda at world 2 resumes the cpu's %s: steps %d-%d within 1e-5, weights %.2g"
          % (step_name(EVERY), EVERY + 1, STEPS, e))
    before = {s: tree_hashes(os.path.join(D2, step_name(s))) for s in (EVERY, INTERRUPT)}
    p, _, _ = mlp.train("cuda", 2, "fault", ["--resume", D2, "--steps", "9", "--ckpt-dir", D2, "--ckpt-every", "1"],
                        expect_ok=False, env={"FSDPC_FAULT": "ckpt:1"})
    latest = open(os.path.join(D2, "latest")).read()
    check(p.returncode != 0, "FSDPC_FAULT=ckpt:1: the job exited 0")
    check(latest == step_name(INTERRUPT) + "\n", "after the fault latest reads %r" % latest)
    check(not os.path.exists(os.path.join(D2, step_name(INTERRUPT + 1))), "after the fault %s exists"
          % step_name(INTERRUPT + 1))
    for s, h in before.items():
        check(tree_hashes(os.path.join(D2, step_name(s))) == h, "after the fault %s changed" % step_name(s))
    print("fault       rank 1 killed while saving step %d: exit %d, latest -> %s, no %s, earlier ones unchanged"
          % (INTERRUPT + 1, p.returncode, step_name(INTERRUPT), step_name(INTERRUPT + 1)))


def launch(mlp, tag, env):
    """two ranks of the cuda world-2 executable started directly, training without end; returns them once
    rank 0 has printed step 3 (the steps are running, CUDA Graph replays among them)"""
    rdv, log0 = mlp.path(tag + ".rdv"), mlp.path(tag + ".rank0.out")
    procs = []
    for r in range(2):
        e = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r), **env)
        out = open(log0 if r == 0 else os.devnull, "w")
        procs.append(subprocess.Popen([mlp.exe("cuda", 2)] + mlp.data + ["--steps", "100000000", "--rendezvous",
                                                                            "file:" + rdv], env=e, stdout=out,
                                      stderr=subprocess.PIPE, text=True))
        out.close()
    t0 = time.time()
    while "step 3/" not in open(log0).read():
        if time.time() - t0 > LIMIT or any(p.poll() is not None for p in procs):
            for p in procs:
                p.kill()
            check(False, "%s: the ranks did not reach step 3 (exits %s)" % (tag, [p.poll() for p in procs]))
        time.sleep(0.1)
    return procs


def ends(p, tag, who):
    """p exits within LIMIT s: (exit status, stderr's error lines, seconds)"""
    t0 = time.time()
    try:
        _, err = p.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        check(False, "%s: %s still ran %d s later (a hang)" % (tag, who, LIMIT))
    lines = [l for l in err.splitlines() if "error" in l]
    return p.returncode, lines, time.time() - t0


def dead_rank(mlp, victim):
    tag = "rank %d killed" % victim
    procs = launch(mlp, "dead%d" % victim, {})
    procs[victim].kill()
    procs[victim].wait()  # reaped, as a launcher does
    other = 1 - victim
    rc, lines, took = ends(procs[other], tag, "rank %d" % other)
    pat = (r"error: rank %d: .*(rank %d \(pid \d+\) of communicator \S+ is gone|lost the connection to rank %d|rank %d "
           r"closed its connection)" % (other, victim, victim, victim))
    check(rc != 0 and len(lines) == 1 and re.search(pat, lines[0]), "%s: rank %d exit %d, expected non-zero and "
          "one line matching %r: %s" % (tag, other, rc, pat, lines))
    print("%-16s rank %d exit %d after %4.1f s: %s" % (tag, other, rc, took, lines[0][lines[0].find("error"):][:140]))


def stalled_rank(mlp):
    tag = "rank 1 stopped"
    procs = launch(mlp, "stalled", {"FSDPC_STEP_TIMEOUT": str(STALL_TIMEOUT)})
    os.kill(procs[1].pid, signal.SIGSTOP)
    try:
        rc, lines, took = ends(procs[0], tag, "rank 0")
    finally:
        os.kill(procs[1].pid, signal.SIGCONT)
    pat = r"error: rank 0: .*did not (finish|complete) within %d s \(FSDPC_STEP_TIMEOUT\)" % STALL_TIMEOUT
    check(rc != 0 and len(lines) == 1 and re.search(pat, lines[0]), "%s: rank 0 exit %d, expected non-zero and one "
          "line matching %r: %s" % (tag, rc, pat, lines))
    rc1, _, _ = ends(procs[1], tag, "rank 1, continued,")
    check(rc1 != 0, "%s: rank 1, continued after rank 0 ended, exited 0" % tag)
    print("%-16s rank 0 exit %d after %4.1f s: %s; rank 1 continued: exit %d"
          % (tag, rc, took, lines[0][lines[0].find("error"):][:140], rc1))


def stopped_at_startup(mlp):
    """rank 1 stopped before it starts (a shell that stops itself, then runs it) under mpirun: rank 0 waits inside
    MPI_Init of the rendezvous through MPI (runtime/rdv_mpi.c), where start-up's guard ends it with one line"""
    tag = "rank 1 stopped at start-up"
    argv = [mlp.exe("cuda", 2)] + mlp.data + ["--steps", "2"]
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1"] + argv + [
        ":", "-np", "1", "sh", "-c", 'kill -STOP $$; exec "$0" "$@"'] + argv
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, FSDPC_START_TIMEOUT="5"))
    rc, lines, took = ends(p, tag, "mpirun")
    lines = [l for l in lines if "FSDPC_START_TIMEOUT" in l]
    pat = (r"error: rank 0: start-up: MPI_Init \(the rendezvous through MPI\) made no progress for 5 s "
           r"\(FSDPC_START_TIMEOUT\): another rank did not arrive")
    check(rc != 0 and len(lines) == 1 and re.search(pat, lines[0]), "%s: exit %d, expected non-zero and one line "
          "matching %r: %s" % (tag, rc, pat, lines))
    print("%-16s exit %d after %4.1f s: %s" % (tag, rc, took, lines[0][lines[0].find("error"):][:140]))


def too_little_memory(mlp):
    for world, mib in ((1, 350), (2, 400)):
        p, _, _ = mlp.train("cuda", world, "nomem_w%d" % world, ["--steps", "2"], expect_ok=False,
                            env={"FSDPC_CUEMU_MEM_MIB": str(mib)})
        lines = [l for l in p.stderr.splitlines() if "error" in l]
        pat = (r"error: needs \d+\.\d\d GiB of device memory \(plan: \d+\.\d\d GiB .*\), GPU 0 \(cuemu [^)]*\)\) has "
               r"%.2f GiB free of %.2f GiB: use more ranks or a smaller --dim batch$" % ((mib - 300) / 1024,
                                                                                        mib / 1024))
        check(p.returncode != 0 and len(lines) == 1 and re.search(pat, lines[0]), "FSDPC_CUEMU_MEM_MIB=%d at world "
              "%d: exit %d, expected non-zero and one line matching %r:\n%s" % (mib, world, p.returncode, pat,
                                                                                p.stderr))
        print("memory      %d MiB at world %d: exit %d: %s" % (mib, world, p.returncode,
                                                            lines[0][lines[0].find("error"):][:150]))
    p, _, _ = mlp.train("cuda", 1, "nomem_ctx", ["--steps", "2"], expect_ok=False, env={"FSDPC_CUEMU_MEM_MIB": "64"})
    check(p.returncode != 0 and "FSDPC_CUEMU_MEM_MIB: '64' is not a size in MiB between 301" in p.stderr,
          "FSDPC_CUEMU_MEM_MIB=64: exit %d, no line naming the variable:\n%s" % (p.returncode, p.stderr))
    print("memory      64 MiB (less than the emulated context): exit %d, the variable named" % p.returncode)


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.environ["FSDPC_NO_TF32"] = "1"
    mlp = Mlp(fsdpc, work)
    checkpoints(mlp)
    dead_rank(mlp, 1)
    dead_rank(mlp, 0)
    stalled_rank(mlp)
    stopped_at_startup(mlp)
    too_little_memory(mlp)
    print("OK cuda_emulate_ops: checkpoints, dead and stalled ranks, too little device memory on the emulated cuda")


if __name__ == "__main__":
    main()
