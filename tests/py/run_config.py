"""Run options kept with the checkpoints (run.toml, restored by --resume) and the config-file form (--config).

usage: run_config.py FSDPC WORKDIR

Model: the shipped MLP (examples/mlp.onnx, mse, AdamW, --dim batch=6) on x.npy (48x16) and t.npy (48x1), at
world 2 (global batch 12).  The options of the reference run R are chosen so that a resume that lost any of
them would differ: --lr, a cosine schedule with warmup, --shuffle --seed 3, --clip-grad-norm, --weight-decay.

1. R: world 2, 8 steps, --ckpt-dir D --ckpt-every 4.  D/step-00000004/run.toml reads, with Python's tomllib,
   as exactly those options (numbers as numbers, --data as an array, no --resume).
2. --resume D/step-00000004 alone (world 2): stdout names the options it took from run.toml (--lr 0.01,
   --steps 8, --shuffle ...); its metrics (R's path, restored) hold steps 5..8 with R's losses exactly (==)
   and its export (R's path) equals R's weights exactly.  The same resume with the full command line gives
   the same losses and weights.
3. --resume D/step-00000004 --lr 0.02 --ckpt-dir D2 --metrics O.jsonl: the startup line does not list --lr;
   the losses equal those of the full command line with --lr 0.02 exactly and differ from R's from step 6;
   D2's checkpoints hold lr = 0.02.  --shuffle=false overrides run.toml's shuffle = true (differs from R).
4. --config C.toml with R's options (keys with '_' and '-', comments, a multi-line array): R's losses and
   weights exactly.  --steps 3 given before --config overrides the file's steps = 8 (3 steps).
5. Bad run files, each refused with exit status 2 and exactly one stderr line naming FILE:LINE and the key:
   an unknown key, a bad number, an unterminated string, a wrong type, a duplicate key, a table, a line of
   100,000 bytes, binary bytes, a bad value the command line overrides; a missing --config file and
   /dev/zero (one line naming it); --metrics naming the --config file (which stays); a checkpoint whose run.toml is a symbolic link, or names resume = ...,
   or has an unknown key (all refused, the checkpoint untouched).  A run.toml with an fp16 build's
   loss-scale is resumed by this fp32 build with the key ignored, and said so.  A checkpoint without
   run.toml (an older fsdpc's) resumes with the full command line, saying so.
6. The ranks agree: mpirun -np 1 EXE --config A : -np 1 EXE --config B, A and B differing in lr, exits 2
   with one line saying rank 1's options differ from rank 0's.
"""
import os
import shutil
import subprocess
import sys
import tomllib

import numpy as np
from common import check, mpirun, onnx_weights, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TIMEOUT = 120


def attempt(cmd, expect_ok=True):
    try:
        return run(cmd, check=expect_ok, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SystemExit("FAILED: did not finish within %d s: %s" % (TIMEOUT, " ".join(cmd)))


def losses(path):
    import json
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in open(path) if l.strip()) if "step" in r}


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    exe = J("mlp")
    attempt([fsdpc, os.path.join(ROOT, "examples", "mlp.onnx"), "-o", exe, "--target", "cpu", "--loss",
             "mse:y,target", "--optimizer", "adamw", "--dim", "batch=6", "--wrap", "size:600"])
    D = J("D")
    opts = ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--steps", "8", "--lr", "0.01",
            "--lr-schedule", "cosine", "--warmup-steps", "2", "--shuffle", "--seed", "3", "--clip-grad-norm", "0.5",
            "--weight-decay", "0.05", "--ckpt-dir", D, "--ckpt-every", "4"]
    R_m, R_o = J("R.jsonl"), J("R.onnx")

    # 1. the reference, and its run.toml
    attempt(mpirun(2, [exe] + opts + ["--metrics", R_m, "--export-onnx", R_o, "--quiet"]))
    L, W = losses(R_m), onnx_weights(R_o)
    check(sorted(L) == list(range(1, 9)), "reference: steps %s" % sorted(L))
    with open(os.path.join(D, "step-00000004", "run.toml"), "rb") as f:
        saved = tomllib.load(f)
    want = {"data": ["x=" + J("x.npy"), "target=" + J("t.npy")], "steps": 8, "lr": 0.01, "lr-schedule": "cosine",
            "warmup-steps": 2, "shuffle": True, "seed": 3, "clip-grad-norm": 0.5, "weight-decay": 0.05,
            "ckpt-dir": D, "ckpt-every": 4, "metrics": R_m, "export-onnx": R_o}
    check(saved == want, "run.toml read by tomllib:\n%s\nexpected\n%s" % (saved, want))
    shutil.copy(R_m, J("R.keep.jsonl"))
    print("1. reference: 8 steps at world 2; run.toml (tomllib) = its %d options" % len(want))

    def same_as(m, o, ref_l, ref_w, first, tag):
        got = losses(m)
        check(sorted(got) == list(range(first, 9)), "%s: steps %s" % (tag, sorted(got)))
        for s, v in got.items():
            check(v == ref_l[s], "%s step %d: loss %r, expected %r (bit for bit)" % (tag, s, v, ref_l[s]))
        w = onnx_weights(o)
        for k, v in ref_w.items():
            check(np.array_equal(w[k], v), "%s: weight %s differs" % (tag, k))

    # 2. --resume alone
    p = attempt(mpirun(2, [exe, "--resume", os.path.join(D, "step-00000004")]))
    line = [l for l in p.stdout.splitlines() if l.startswith("options from ")]
    check(len(line) == 1, "resume alone: no single 'options from' line:\n" + p.stdout)
    for piece in ("--lr 0.01", "--steps 8", "--shuffle", "--seed 3", "--lr-schedule cosine", "--data x="):
        check(piece in line[0], "resume alone: %r not in %r" % (piece, line[0]))
    same_as(R_m, R_o, L, W, 5, "resume alone")
    attempt(mpirun(2, [exe, "--resume", os.path.join(D, "step-00000004")] + opts +
                   ["--metrics", J("F.jsonl"), "--export-onnx", J("F.onnx"), "--quiet"]))
    same_as(J("F.jsonl"), J("F.onnx"), L, W, 5, "resume with the full command line")
    print("2. --resume D/step-00000004 alone = with the full command line = the uninterrupted run (steps 5-8)")

    # 3. a flag overrides run.toml
    D2 = J("D2")
    p = attempt(mpirun(2, [exe, "--resume", os.path.join(D, "step-00000004"), "--lr", "0.02", "--ckpt-dir", D2,
                           "--metrics", J("O.jsonl"), "--export-onnx", J("O.onnx")]))
    line = [l for l in p.stdout.splitlines() if l.startswith("options from ")]
    check(len(line) == 1 and "--lr " not in line[0] and "--steps 8" in line[0], "override: %r" % line)
    full = [exe, "--resume", os.path.join(D, "step-00000004")] + opts + ["--lr", "0.02", "--ckpt-dir", J("D3"),
                                                                          "--metrics", J("P.jsonl"),
                                                                          "--export-onnx", J("P.onnx")]
    attempt(mpirun(2, full))
    PL = losses(J("P.jsonl"))
    same_as(J("O.jsonl"), J("O.onnx"), PL, onnx_weights(J("P.onnx")), 5, "--lr 0.02 overriding run.toml")
    check(all(PL[s] != L[s] for s in range(6, 9)), "--lr 0.02: losses %s equal the reference's %s" % (PL, L))
    with open(os.path.join(D2, "step-00000008", "run.toml"), "rb") as f:
        d2 = tomllib.load(f)
    check(d2["lr"] == 0.02 and d2["ckpt-dir"] == D2, "D2's run.toml: %s" % d2)
    attempt(mpirun(2, [exe, "--resume", os.path.join(D, "step-00000004"), "--shuffle=false", "--ckpt-dir", J("D4"),
                       "--metrics", J("S.jsonl"), "--export-onnx", J("S.onnx")]))
    check(losses(J("S.jsonl"))[5] != L[5], "--shuffle=false: step 5 reads the shuffled samples all the same")
    print("3. --lr 0.02 overrides run.toml (= the full command line with it; D2 keeps lr = 0.02); "
          "--shuffle=false too")

    # 4. --config
    C = J("C.toml")
    with open(C, "w") as f:
        f.write("# the reference's options\ndata = [\n    \"x=%s\",   # the inputs\n    'target=%s',\n]\n"
                "steps = 8\nlr = 1e-2\nlr_schedule = \"cosine\"\nwarmup-steps = 2\nshuffle = true  # epochs\n"
                "seed = 3\nclip_grad_norm = 0.5\nweight-decay = 5e-2\nmetrics = \"%s\"\nexport-onnx = \"%s\"\n"
                "quiet = true\n" % (J("x.npy"), J("t.npy"), J("C.jsonl"), J("C.onnx")))
    attempt(mpirun(2, [exe, "--config", C]))
    same_as(J("C.jsonl"), J("C.onnx"), L, W, 1, "--config")
    attempt(mpirun(2, [exe, "--steps", "3", "--config", C, "--metrics", J("C3.jsonl")]))
    check(sorted(losses(J("C3.jsonl"))) == [1, 2, 3], "--steps 3 --config: steps %s" % sorted(losses(J("C3.jsonl"))))
    print("4. --config = the flags (8 steps, bit for bit); --steps 3 before --config overrides it")

    # 5. bad run files: one line, exit 2
    def refused(argv, needles, tag, world=1):
        p = attempt(mpirun(world, argv), expect_ok=False)
        err = p.stderr.strip().splitlines()
        if world > 1:  # past mpirun's own report
            err = [l for l in err if ": error: " in l]
        check(p.returncode == 2, "%s: exit %d, expected 2\n%s" % (tag, p.returncode, p.stderr))
        check(len(err) == 1, "%s: %d stderr lines, expected 1:\n%s" % (tag, len(err), p.stderr))
        for n in needles:
            check(n in err[0], "%s: %r not in %r" % (tag, n, err[0]))
        return err[0]

    base = [exe, "--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--steps", "1", "--quiet"]
    B = J("bad.toml")
    cases = [("steps = 2\nfoo = 1\n", ["bad.toml:2", "unknown key 'foo'"]),
             ("lr = 1e-3x\n", ["bad.toml:1", "'lr'", "number"]),
             ("# ok\nlr-schedule = \"cosine\n", ["bad.toml:2", "'lr-schedule'", "unterminated string"]),
             ("steps = 1.5\n", ["bad.toml:1", "'steps'", "an integer"]),
             ("shuffle = 1\n", ["bad.toml:1", "'shuffle'", "true or false"]),
             ("lr = 0.1\nlr = 0.2\n", ["bad.toml:2", "'lr'", "twice"]),
             ("[train]\nlr = 0.1\n", ["bad.toml:1", "tables"]),
             ("lr = \"%s\"\n" % ("9" * 100000), ["bad.toml:1", "longer than"]),
             ("lr = 0.1\n\x00\x01\xff\n", ["bad.toml:2", "control byte"]),
             ("steps = -4\n", ["bad.toml:1", "'steps'", "out of range"]),  # --steps 1 overrides it: still refused
             ("lr = nan\n", ["bad.toml:1", "'lr'", "finite"]),
             ("data = [\"a=b\"\n", ["bad.toml", "'data'", "array"])]
    for text, needles in cases:
        with open(B, "wb") as f:
            f.write(text.encode("latin-1"))
        refused(base + ["--config", B], needles, "config %r" % text[:30])
    refused(base + ["--config", J("missing.toml")], ["--config", "missing.toml"], "a missing --config")
    refused(base + ["--config", "/dev/zero"], ["/dev/zero", "not a regular file"], "--config /dev/zero")
    with open(B, "w") as f:
        f.write("lr = 0.1\n")
    refused(base + ["--config", B, "--metrics", B], ["--metrics", "is the --config file"], "--metrics onto --config")
    check(open(B).read() == "lr = 0.1\n", "--metrics onto --config: the config file changed")
    with open(B, "w") as f:
        f.write("lr = 1e-3x\n")
    refused(base + ["--config", B], ["bad.toml:1", "'lr'"], "a bad config at world 2", world=2)
    # tampered checkpoints: a copy of D/step-00000004
    K = J("K")

    def tampered(how, needles, tag):
        shutil.rmtree(K, ignore_errors=True)
        shutil.copytree(os.path.join(D, "step-00000004"), K)
        rt = os.path.join(K, "run.toml")
        how(rt)
        before = {n: open(os.path.join(K, n), "rb").read() for n in os.listdir(K) if os.path.isfile(os.path.join(K, n))}
        refused([exe, "--resume", K], needles, tag)
        after = {n: open(os.path.join(K, n), "rb").read() for n in os.listdir(K) if os.path.isfile(os.path.join(K, n))}
        check(before == after, "%s: the checkpoint changed" % tag)

    def link(rt):
        os.rename(rt, J("elsewhere.toml"))
        os.symlink(J("elsewhere.toml"), rt)
    tampered(link, ["run.toml", "symbolic link"], "run.toml a link")
    tampered(lambda rt: open(rt, "a").write("resume = \"%s\"\n" % D), ["run.toml:", "'resume'"], "run.toml resume")
    tampered(lambda rt: open(rt, "a").write("learning-rate = 1\n"), ["run.toml:", "unknown key 'learning-rate'"],
             "run.toml unknown key")
    # another build's option is ignored, and said so
    shutil.rmtree(K)
    shutil.copytree(os.path.join(D, "step-00000004"), K)
    with open(os.path.join(K, "run.toml"), "a") as f:
        f.write("loss-scale = 1024.0\n")
    p = attempt([exe, "--resume", K, "--ckpt-dir", J("D5"), "--metrics", J("K.jsonl"), "--export-onnx", J("K.onnx")])
    check("ignored (another build's): --loss-scale" in p.stdout, "loss-scale in run.toml:\n" + p.stdout)
    # an older fsdpc's checkpoint: no run.toml
    os.unlink(os.path.join(K, "run.toml"))
    p = attempt([exe, "--resume", K] + opts[:-4] + ["--quiet", "--metrics", J("K2.jsonl")])
    check("no %s" % os.path.join(K, "run.toml") in p.stdout, "no run.toml:\n" + p.stdout)
    print("5. bad run files refused in one line with exit 2 (%d --config cases, 3 tampered run.toml); another "
          "build's key ignored; a checkpoint without run.toml resumes" % (len(cases) + 3))

    # 6. ranks with different options
    A = J("A.toml")
    with open(A, "w") as f:
        f.write("lr = 0.02\n")
    with open(B, "w") as f:
        f.write("lr = 0.03\n")
    argv = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "1"] + base + ["--config", A, ":", "-np", "1"] \
        + base + ["--config", B]
    p = attempt(argv, expect_ok=False)
    check(p.returncode == 2 and "rank 1: this rank's options differ from rank 0's" in p.stderr,
          "ranks with different --config files: exit %d\n%s" % (p.returncode, p.stderr))
    print("6. ranks reading different options: refused (exit 2)")
    print("OK")


if __name__ == "__main__":
    main()
