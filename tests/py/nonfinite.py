"""A step whose loss or gradient norm is not finite is never applied (--on-nonfinite stop|skip).

usage: nonfinite.py FSDPC WORKDIR

Model: the shipped MLP (examples/mlp.onnx, mse, AdamW) on x.npy (48x16) and
t.npy (48x1) from default_rng(0), global batch 12 (4 steps a pass over the
data), built for world 1 and world 2 (batch 12/W per rank).  xnan.npy is x
with one NaN in row 31: step 3's batch (rows 24-35), rank 1's half at world
2 (rank 0's at world 1).  tbig.npy is t with rows 24-35 at 1.2e19: step 3's
loss is finite (~1.4e38, and so is the sum over 2 ranks) but its gradient's
squared norm overflows float.
Every run has a time limit: a hang fails the test.

At world 1 and 2:
1. stop (the default): --data x=xnan.npy --steps 6 --ckpt-dir D
   --ckpt-every 1 --export-onnx E --metrics M exits 1 with exactly one
   stderr line (mpirun's own lines aside) naming step 3, the loss and the
   rank (1 at world 2) and --on-nonfinite; D/latest reads step-00000002, D
   holds no step-00000003, E does not exist, M holds steps 1 and 2 only.
2. --lr 1e30: exits 1, one line "error: step N:" with N >= 2, no export.
3. tbig.npy: exits 1 naming step 3 and "gradient norm".
4. --on-nonfinite skip with xnan.npy, --steps 6 --ckpt-every 1: exit 0;
   the metrics of steps 3 (skipped) and 1,2,4,5,6 (not) carry skipped and
   skipped_total (0,0,1,1,1,1); step 3's step line says skipped; the rank
   files of step-00000003 equal step-00000002's byte for byte (parameters
   and moments untouched) and both manifests say "updates 2"; step 6's
   says "updates 5"; the exported weights are finite.  A --resume of
   step-00000003 --steps 6 gives the losses of steps 4..6 exactly and
   skipped_total 1 (the skip count survives the checkpoint).  With NaN in
   every row (xallnan.npy), --steps 3: no step applied, exit 1 with one
   line "no step was applied", no export.
5. fp16 (world 1): a NaN loss stops as in 1; tbig.npy's overflow is still a
   skip with the loss scale halved (exit 0).
"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np

from common import check, mpirun, onnx_weights, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT = 120


def attempt(cmd, expect_ok):
    try:
        p = run(cmd, check=False, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SystemExit("FAILED: did not finish within %d s: %s" % (TIMEOUT, " ".join(cmd)))
    ok = p.returncode == 0
    check(ok == expect_ok, "exit %d (expected %s): %s\nstdout:\n%s\nstderr:\n%s" % (
        p.returncode, "0" if expect_ok else "non-zero", " ".join(cmd), p.stdout[-3000:], p.stderr[-3000:]))
    return p


def our_lines(stderr):
    """stderr without mpirun's own report"""
    return [l for l in stderr.splitlines() if ": error: " in l or ": warning: " in l]


def steps(path):
    return [json.loads(l) for l in open(path) if l.strip() and '"step"' in l]


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 16)).astype(np.float32)
    t = rng.standard_normal((48, 1)).astype(np.float32)
    np.save(J("x.npy"), x)
    np.save(J("t.npy"), t)
    xn = x.copy()
    xn[31, 5] = np.nan
    np.save(J("xnan.npy"), xn)
    np.save(J("xallnan.npy"), np.full_like(x, np.nan))
    tb = t.copy()
    tb[24:36] = 1.2e19
    np.save(J("tbig.npy"), tb)
    model = os.path.join(ROOT, "examples", "mlp.onnx")

    def build(world, extra=()):
        path = J("mlp_w%d%s" % (world, "".join(extra).replace("-", "")))
        run([fsdpc, model, "-o", path, "--target", "cpu", "--loss", "mse:y,target", "--optimizer", "adamw",
             "--dim", "batch=%d" % (12 // world), "--wrap", "size:600", "--verify"] + list(extra))
        return path

    for world in (1, 2):
        exe = build(world)
        tag = "world %d" % world

        def train(name, args, expect_ok):
            return attempt(mpirun(world, [exe, "--metrics", J(name + ".jsonl")] + args), expect_ok)

        # 1. NaN data: stops at step 3 before its update, checkpoint and export
        D, E = J("ck_stop_w%d" % world), J("stop_w%d.onnx" % world)
        p = train("stop_w%d" % world, ["--data", "x=" + J("xnan.npy"), "--data", "target=" + J("t.npy"),
                                       "--steps", "6", "--ckpt-dir", D, "--ckpt-every", "1", "--export-onnx", E],
                  False)
        lines = our_lines(p.stderr)
        want_rank = "rank %d" % (world - 1)
        check(len(lines) == 1 and "error: step 3: the loss is NaN on " + want_rank in lines[0] and
              "--on-nonfinite skip" in lines[0], "%s: the stop line: %r" % (tag, p.stderr))
        check(open(os.path.join(D, "latest")).read().strip() == "step-00000002",
              "%s: latest after the stop is not step-00000002" % tag)
        check(not os.path.exists(os.path.join(D, "step-00000003")), "%s: step 3 was checkpointed" % tag)
        check(not os.path.exists(E), "%s: the poisoned model was exported" % tag)
        check([r["step"] for r in steps(J("stop_w%d.jsonl" % world))] == [1, 2],
              "%s: the metrics of the stopped run" % tag)

        # 2. a learning rate that blows the weights up
        E2 = J("lr_w%d.onnx" % world)
        p = train("lr_w%d" % world, ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--steps", "6",
                                     "--lr", "1e30", "--export-onnx", E2], False)
        lines = our_lines(p.stderr)
        check(len(lines) == 1 and "error: step " in lines[0] and "error: step 1:" not in lines[0],
              "%s --lr 1e30: %r" % (tag, p.stderr))
        check(not os.path.exists(E2), "%s --lr 1e30: exported" % tag)

        # 3. a finite loss whose gradient norm overflows
        p = train("big_w%d" % world, ["--data", "x=" + J("x.npy"), "--data", "target=" + J("tbig.npy"),
                                      "--steps", "6"], False)
        lines = our_lines(p.stderr)
        check(len(lines) == 1 and "error: step 3: the gradient norm is infinite" in lines[0],
              "%s: the gradient stop line: %r" % (tag, p.stderr))

        # 4. skip: step 3 changes nothing, training goes on, the count survives a resume
        D4, E4 = J("ck_skip_w%d" % world), J("skip_w%d.onnx" % world)
        p = train("skip_w%d" % world, ["--data", "x=" + J("xnan.npy"), "--data", "target=" + J("t.npy"),
                                       "--steps", "6", "--ckpt-dir", D4, "--ckpt-every", "1", "--export-onnx", E4,
                                       "--on-nonfinite", "skip"], True)
        rows = steps(J("skip_w%d.jsonl" % world))
        check([r["step"] for r in rows] == [1, 2, 3, 4, 5, 6], "%s skip: the metrics' steps" % tag)
        check([r["skipped"] for r in rows] == [False, False, True, False, False, False] and
              [r["skipped_total"] for r in rows] == [0, 0, 1, 1, 1, 1], "%s skip: skipped fields %r" % (tag, rows))
        check(rows[2]["loss"] is None and all(r["loss"] is not None for r in rows[3:]),
              "%s skip: losses %r" % (tag, [r["loss"] for r in rows]))
        check(any(l.startswith("step 3/6") and "skipped: the loss is not finite (1 skipped so far)" in l
                  for l in p.stdout.splitlines()), "%s skip: step line:\n%s" % (tag, p.stdout))
        s2, s3 = os.path.join(D4, "step-00000002"), os.path.join(D4, "step-00000003")
        for f in sorted(os.listdir(s2)):
            if f.startswith("rank-"):
                check(open(os.path.join(s2, f), "rb").read() == open(os.path.join(s3, f), "rb").read(),
                      "%s skip: %s changed in the skipped step" % (tag, f))
        upd = lambda d: [l for l in open(os.path.join(D4, d, "manifest")) if l.startswith("updates ")]
        check(upd("step-00000002") == upd("step-00000003") == ["updates 2\n"] and
              upd("step-00000006") == ["updates 5\n"], "%s skip: the manifests' update counts" % tag)
        check(all(np.all(np.isfinite(w)) for w in onnx_weights(E4).values()), "%s skip: non-finite weights" % tag)
        train("resume_w%d" % world, ["--data", "x=" + J("xnan.npy"), "--data", "target=" + J("t.npy"),
                                     "--steps", "6", "--resume", s3, "--on-nonfinite", "skip"], True)
        back = steps(J("resume_w%d.jsonl" % world))
        check([r["loss"] for r in back] == [r["loss"] for r in rows[3:]] and back[-1]["skipped_total"] == 1,
              "%s: resumed from the skipped step: %r" % (tag, back))

        # 4b. skip, and no step applied: exit 1 with one line, no export
        E5 = J("none_w%d.onnx" % world)
        p = train("none_w%d" % world, ["--data", "x=" + J("xallnan.npy"), "--data", "target=" + J("t.npy"),
                                       "--steps", "3", "--export-onnx", E5, "--on-nonfinite", "skip"], False)
        lines = our_lines(p.stderr)
        check(len(lines) == 1 and "error: no step was applied: all 3 steps of this run were skipped" in lines[0],
              "%s skip, every step: %r" % (tag, p.stderr))
        check(not os.path.exists(E5), "%s skip, every step: exported" % tag)

    # 5. fp16: a NaN loss stops; an overflow stays a skip with the scale backed off
    exe = build(1, ("--precision", "fp16"))
    p = attempt([exe, "--data", "x=" + J("xnan.npy"), "--data", "target=" + J("t.npy"), "--steps", "6"], False)
    lines = our_lines(p.stderr)
    check(len(lines) == 1 and "error: step 3: the loss is NaN on rank 0" in lines[0], "fp16 NaN: %r" % p.stderr)
    attempt([exe, "--data", "x=" + J("x.npy"), "--data", "target=" + J("tbig.npy"), "--steps", "6",
             "--metrics", J("fp16.jsonl")], True)
    rows = steps(J("fp16.jsonl"))
    check([r["skipped"] for r in rows] == [False, False, True, False, False, False] and
          rows[3]["loss_scale"] * 2 == rows[2]["loss_scale"], "fp16 overflow: %r" % rows)
    print("ok")


if __name__ == "__main__":
    main()
