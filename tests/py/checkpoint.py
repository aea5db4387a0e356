"""Sharded checkpoints: --ckpt-dir/--ckpt-every save, --resume continues bit-for-bit or resharded.

usage: checkpoint.py FSDPC WORKDIR

Model: the shipped MLP (examples/mlp.onnx, mse, AdamW, --wrap size:600) on
x.npy (48x16) and t.npy (48x1) from default_rng(0), global batch 12, so the
per-rank batch is 12/W; each (world, strategy) executable is compiled once.

1. Reference: world 4, full, 10 uninterrupted steps -> losses L[1..10] and the
   exported weights W.
2. Interrupted: world 4, full, --steps 6 --ckpt-dir D --ckpt-every 4: D holds
   exactly latest, step-00000004 and step-00000006; latest reads
   "step-00000006"; each checkpoint holds exactly manifest, consts.bin, run.toml and
   rank-00000.bin..rank-00003.bin; the losses of steps 1-6 equal L[1..6]
   exactly (==).  --resume D (the directory: latest is used) --steps 10 at
   world 4: the metrics (memory line first) hold exactly steps 7..10, their
   losses equal L[7..10] exactly and every exported weight equals W exactly.
3. Resharding: --resume D/step-00000004 --steps 10 at world 2 full, world 3
   full, world 4 hybrid:2, world 2 none and world 1 grad_op: exactly steps
   5..10, every loss within 1e-6 (relative) of L and every exported weight
   within 1e-6 (rel_err) of W.  These runs also pass --ckpt-dir: the
   checkpoint after their last step, step-00000010, is named by latest and
   holds the rank files of the first shard group only (hybrid:2 at world 4:
   rank-00000/00001; none and world 1: rank-00000; full at W: W files).
4. A rank killed during a save: a fresh D2 gets step-00000004 and
   step-00000006 as in 2; then world 4 --resume D2 --steps 9 --ckpt-dir D2
   --ckpt-every 1 with FSDPC_FAULT=ckpt:2 (rank 2 writes half of its shard
   file during the step-7 save and exits 1) fails non-zero; D2/latest still
   reads step-00000006, no step-00000007 exists, and the files of
   step-00000004 and step-00000006 are unchanged (sha256).  --resume D2
   --steps 10 at world 4 without the fault still gives exactly steps 7..10
   with losses equal to L[7..10] and weights equal to W.
5. Corruption: a copy C of D/step-00000006 with one byte in the middle of
   rank-00001.bin flipped: --resume C --steps 10 fails non-zero at world 4
   and at world 1 (there with exactly one stderr line), a stderr line naming
   rank-00001.bin and "checksum"; C's files (names and sha256) are unchanged.
5b. A tampered manifest (a parameter past its unit, truncated, a non-hex
    name, an unknown record, step 6 edited to step 4, data_pos edited, a
    wrong checksum on the end record, none, a record after the end): one
    line naming the manifest, exit 1; the step, data_pos and wrong-checksum
    edits are refused for their checksum.  A world of 2^32 + W with a
    valid checksum is refused too (not read as W).
6. Bad flags: --resume of a directory with neither manifest nor latest fails
   non-zero naming the path; --ckpt-every 0 exits 2.
7. Links planted in --ckpt-dir (by anyone who can write there): at world 2
   --steps 2 --ckpt-every 1, a stale .step-00000001.tmp that is a link to a
   folder, then (saving again) step-00000002, .step-00000002.old and latest
   as links: every run succeeds with real checkpoints and latest, and the
   links' targets keep every file (sha256); --save-best with best a link
   fails in one line, its target untouched.  A --ckpt-dir that is the
   user's own link to a folder works: saves land in the folder, --resume
   through the link continues; an export naming one of the --resume
   checkpoint's files is refused in one line, the checkpoint unchanged.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
from common import check, mpirun, onnx_weights, rel_err, run, write_manifest
from common import check, mpirun, onnx_weights, rel_err, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

GLOBAL_B, STEPS, INTERRUPT, EVERY = 12, 10, 6, 4
TIMEOUT = 120   # a run takes well under a second; a hang (a rank waiting on a dead one) fails the test
# the resharded resumes: (world, strategy, files per checkpoint = the first shard group's ranks)
RESHARD = [(2, "full", 2), (3, "full", 3), (4, "hybrid:2", 2), (2, "none", 1), (1, "grad_op", 1)]


def step_name(s):
    return "step-%08d" % s


def attempt(cmd, expect_ok=True, env=None):
    try:
        return run(cmd, check=expect_ok, env=env, timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SystemExit("FAILED: did not finish within %d s: %s" % (TIMEOUT, " ".join(cmd)))


def metrics(path):
    """the step rows of a metrics file, after checking its first line is the memory report"""
    rows = [json.loads(l) for l in open(path) if l.strip()]
    check(len(rows) > 0 and "memory" in rows[0], "%s: the first line is not the memory report" % path)
    return [r for r in rows[1:] if "step" in r]


def tree_hashes(d):
    """relative path -> sha256 of every file under d"""
    out = {}
    for base, _, files in os.walk(d):
        for f in files:
            p = os.path.join(base, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def read_latest(d):
    p = os.path.join(d, "latest")
    check(os.path.isfile(p), "%s does not exist" % p)
    with open(p) as f:
        return f.read()


def check_ckpt(d, nfiles, tag):
    """d is a complete checkpoint with the rank files of nfiles ranks"""
    check(os.path.isdir(d), "%s: checkpoint %s does not exist" % (tag, d))
    want = {"manifest", "consts.bin", "run.toml"} | {"rank-%05d.bin" % r for r in range(nfiles)}
    have = set(os.listdir(d))
    check(have == want, "%s: %s holds %s, expected %s" % (tag, d, sorted(have), sorted(want)))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    model = os.path.join(ROOT, "examples", "mlp.onnx")

    exes = {}

    def exe(world, strategy):
        """the executable for per-rank batch 12/world and the strategy, compiled on first use"""
        key = (world, strategy)
        if key not in exes:
            path = J("mlp_%s_w%d" % (strategy.replace(":", ""), world))
            attempt([fsdpc, model, "-o", path, "--target", "cpu", "--loss", "mse:y,target", "--optimizer", "adamw",
                     "--dim", "batch=%d" % (GLOBAL_B // world), "--wrap", "size:600", "--verify",
                     "--shard", strategy])
            exes[key] = path
        return exes[key]

    def train(world, strategy, tag, extra, expect_ok=True, env=None):
        """run one training job; returns (process, metrics path, exported onnx path)"""
        m, o = J(tag + ".jsonl"), J(tag + ".onnx")
        argv = [exe(world, strategy), "--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"),
                "--lr", "1e-3", "--metrics", m, "--export-onnx", o, "--quiet"] + extra
        return attempt(mpirun(world, argv), expect_ok, env), m, o

    # 1. the uninterrupted reference
    _, m, o = train(4, "full", "ref", ["--steps", str(STEPS)])
    rows = metrics(m)
    check([r["step"] for r in rows] == list(range(1, STEPS + 1)),
          "reference: steps %s" % [r["step"] for r in rows])
    L = {r["step"]: r["loss"] for r in rows}
    W = onnx_weights(o)
    check(len(W) > 0, "reference: no weights exported")
    print("reference   world 4 full, %d steps: losses %s" % (STEPS, " ".join("%.6f" % L[s] for s in sorted(L))))

    def same_losses(rows, first, tag, tol=None):
        steps = [r["step"] for r in rows]
        check(steps == list(range(first, STEPS + 1)), "%s: metrics hold steps %s, expected %d..%d"
              % (tag, steps, first, STEPS))
        for r in rows:
            s, a, b = r["step"], r["loss"], L[r["step"]]
            if tol is None:
                check(a == b, "%s step %d: loss %r, uninterrupted %r (should be bit-for-bit equal)" % (tag, s, a, b))
            else:
                check(abs(a - b) <= tol * abs(b), "%s step %d: loss %.9g, uninterrupted %.9g" % (tag, s, a, b))

    def same_weights(path, tag, tol=None):
        w = onnx_weights(path)
        check(set(w) == set(W), "%s: exported %s, the reference %s" % (tag, sorted(w), sorted(W)))
        worst = 0.0
        for k, v in W.items():
            check(w[k].shape == v.shape and w[k].dtype == v.dtype, "%s: weight %s is %s %s, the reference %s %s"
                  % (tag, k, w[k].dtype, w[k].shape, v.dtype, v.shape))
            if tol is None:
                check(np.array_equal(w[k], v), "%s: weight %s differs from the uninterrupted run by %.3g "
                      "(should be bit-for-bit equal)" % (tag, k, rel_err(w[k], v)))
            else:
                e = rel_err(w[k], v)
                check(e <= tol, "%s: weight %s differs from the uninterrupted run by %.3g" % (tag, k, e))
                worst = max(worst, e)
        return worst

    def interrupted(d, tag):
        """world 4 full, steps 1..6 with checkpoints after steps 4 and 6 into d"""
        _, m, _ = train(4, "full", tag, ["--steps", str(INTERRUPT), "--ckpt-dir", d, "--ckpt-every", str(EVERY)])
        rows = metrics(m)
        check([r["step"] for r in rows] == list(range(1, INTERRUPT + 1)), "%s: steps %s"
              % (tag, [r["step"] for r in rows]))
        for r in rows:
            check(r["loss"] == L[r["step"]], "%s step %d: loss %r, uninterrupted %r (should be bit-for-bit equal)"
                  % (tag, r["step"], r["loss"], L[r["step"]]))
        want = {"latest", step_name(EVERY), step_name(INTERRUPT)}
        have = set(os.listdir(d))
        check(have == want, "%s: %s holds %s, expected %s" % (tag, d, sorted(have), sorted(want)))
        check(read_latest(d) == step_name(INTERRUPT) + "\n", "%s: %s/latest reads %r, expected %r"
              % (tag, d, read_latest(d), step_name(INTERRUPT) + "\n"))
        for s in (EVERY, INTERRUPT):
            check_ckpt(os.path.join(d, step_name(s)), 4, tag)

    # 2. interrupted after step 6, resumed at the same world size and strategy: bit-for-bit
    D = J("D")
    interrupted(D, "interrupted")
    print("interrupted world 4 full, steps 1-%d: losses == reference; %s/{%s,%s}, latest -> %s"
          % (INTERRUPT, os.path.basename(D), step_name(EVERY), step_name(INTERRUPT), step_name(INTERRUPT)))
    _, m, o = train(4, "full", "resumed", ["--resume", D, "--steps", str(STEPS)])
    same_losses(metrics(m), INTERRUPT + 1, "resumed")
    same_weights(o, "resumed")
    print("resumed     world 4 full from %s (latest), steps %d-%d: losses and weights == reference"
          % (os.path.basename(D), INTERRUPT + 1, STEPS))

    # 3. resharding: step 4's checkpoint resumed at other world sizes, strategies and per-rank batches
    src = os.path.join(D, step_name(EVERY))
    for world, strategy, nfiles in RESHARD:
        tag = "reshard_%s_w%d" % (strategy.replace(":", ""), world)
        out = J(tag + "_ckpt")
        _, m, o = train(world, strategy, tag, ["--resume", src, "--steps", str(STEPS), "--ckpt-dir", out])
        same_losses(metrics(m), EVERY + 1, tag, 1e-6)
        e = same_weights(o, tag, 1e-6)
        check(read_latest(out) == step_name(STEPS) + "\n", "%s: %s/latest reads %r, expected %r"
              % (tag, out, read_latest(out), step_name(STEPS) + "\n"))
        check_ckpt(os.path.join(out, step_name(STEPS)), nfiles, tag)
        print("resharded   world %d %-8s (batch %d/rank) from %s, steps %d-%d: losses within 1e-6, weights %.2g; "
              "its checkpoint holds %d rank file(s)" % (world, strategy, GLOBAL_B // world, step_name(EVERY),
                                                        EVERY + 1, STEPS, e, nfiles))

    # 4. rank 2 dies halfway through writing its shard of the step-7 checkpoint
    D2 = J("D2")
    interrupted(D2, "interrupted2")
    before = {s: tree_hashes(os.path.join(D2, step_name(s))) for s in (EVERY, INTERRUPT)}
    p, _, _ = train(4, "full", "fault", ["--resume", D2, "--steps", "9", "--ckpt-dir", D2, "--ckpt-every", "1"],
                    expect_ok=False, env={"FSDPC_FAULT": "ckpt:2"})
    check(p.returncode != 0, "FSDPC_FAULT=ckpt:2: the job should fail, it exited 0")
    check(read_latest(D2) == step_name(INTERRUPT) + "\n", "after the fault %s/latest reads %r, expected %r"
          % (D2, read_latest(D2), step_name(INTERRUPT) + "\n"))
    check(not os.path.exists(os.path.join(D2, step_name(INTERRUPT + 1))),
          "after the fault %s exists: an incomplete checkpoint is visible" % step_name(INTERRUPT + 1))
    for s, h in before.items():
        check(tree_hashes(os.path.join(D2, step_name(s))) == h, "after the fault %s changed" % step_name(s))
    _, m, o = train(4, "full", "after_fault", ["--resume", D2, "--steps", str(STEPS)])
    same_losses(metrics(m), INTERRUPT + 1, "after the fault")
    same_weights(o, "after the fault")
    print("fault       rank 2 killed while saving step %d: exit %d, latest -> %s, no %s; resumed steps %d-%d == "
          "reference" % (INTERRUPT + 1, p.returncode, step_name(INTERRUPT), step_name(INTERRUPT + 1),
                         INTERRUPT + 1, STEPS))

    # 5. a flipped byte in a shard file: a checksum error at start-up, the checkpoint left as it is
    C = J("C")
    shutil.copytree(os.path.join(D, step_name(INTERRUPT)), C)
    victim = os.path.join(C, "rank-00001.bin")
    with open(victim, "r+b") as f:
        data = f.read()
        check(len(data) > 0, "%s is empty" % victim)
        f.seek(len(data) // 2)
        f.write(bytes([data[len(data) // 2] ^ 0xFF]))
    hashes = tree_hashes(C)
    for world, strategy in ((4, "full"), (1, "grad_op")):
        tag = "corrupt_w%d" % world
        p, _, _ = train(world, strategy, tag, ["--resume", C, "--steps", str(STEPS)], expect_ok=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        hit = [l for l in lines if "rank-00001.bin" in l and "checksum" in l]
        check(p.returncode != 0, "%s: resuming from a corrupted checkpoint should fail, it exited 0" % tag)
        check(len(hit) > 0, "%s: no stderr line names rank-00001.bin and its checksum:\n%s" % (tag, p.stderr[-2000:]))
        if world == 1:
            check(len(lines) == 1, "%s: %d error lines, expected 1:\n%s" % (tag, len(lines), p.stderr[-2000:]))
        check(tree_hashes(C) == hashes, "%s: the corrupted checkpoint's files changed" % tag)
        print("corrupt     world %d: exit %d: %s" % (world, p.returncode, hit[0][:150]))

    # 5b. a tampered manifest (untrusted input): each a one-line error naming the manifest's line, no crash
    good = open(os.path.join(D, step_name(INTERRUPT), "manifest")).read().splitlines()
    param = next(i for i, l in enumerate(good) if l.startswith("param "))
    f = good[param].split()
    tampered = {
        "a parameter past its unit": good[:param] + [" ".join(f[:2] + ["99999999"] + f[3:])] + good[param + 1:],
        "a truncated manifest": good[:param],
        "a name that is not hex": good[:param] + [" ".join(f[:4] + ["zz"])] + good[param + 1:],
        "an unknown record": good[:2] + ["rm -rf /"] + good[2:],
        "step 6 edited to step 4": [("step 4" if l == "step %d" % INTERRUPT else l) for l in good],
        "data_pos edited": [("data_pos 0" if l.startswith("data_pos ") else l) for l in good],
        "a wrong checksum": good[:-1] + [good[-1][:-1] + ("0" if good[-1][-1] != "0" else "1")],
        "no checksum": good[:-1] + ["end"],
        "a record after the end": good + ["step 4"],
    }
    check(good[-1].startswith("end ") and "step %d" % INTERRUPT in good and
          any(l.startswith("data_pos ") and l != "data_pos 0" for l in good), "the manifest's records:\n%s" % good)
    for what, lines in tampered.items():
        T = J("tampered")
        shutil.rmtree(T, ignore_errors=True)
        shutil.copytree(os.path.join(D, step_name(INTERRUPT)), T)
        with open(os.path.join(T, "manifest"), "w") as out:
            out.write("\n".join(lines) + "\n")
        p, _, _ = train(1, "grad_op", "tampered", ["--resume", T, "--steps", str(STEPS)], expect_ok=False)
        errs = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode == 1 and len(errs) == 1 and "manifest" in errs[0],
              "%s: expected exit 1 and one line naming the manifest, got %d:\n%s" % (what, p.returncode, p.stderr))
        if "edited" in what or "wrong" in what:
            check("checksum does not match" in errs[0], "%s: the refusal does not name the checksum: %s" % (what, errs[0]))
        print("tampered    %-26s -> %s" % (what, errs[0][errs[0].find("--resume"):][:110]))

    # a world of 2^32 + W, checksummed again: refused ("%d" read it as W)
    T = J("tampered")
    shutil.rmtree(T, ignore_errors=True)
    shutil.copytree(os.path.join(D, step_name(INTERRUPT)), T)
    write_manifest(os.path.join(T, "manifest"), [("world %d" % (2**32 + int(l.split()[1])) if l.startswith("world ")
                                                  else l) for l in good])
    p, _, _ = train(1, "grad_op", "tampered", ["--resume", T, "--steps", str(STEPS)], expect_ok=False)
    errs = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 1 and len(errs) == 1 and "manifest" in errs[0] and "an unknown record" in errs[0],
          "a world of 2^32 + W: expected exit 1 and one line, got %d:\n%s" % (p.returncode, p.stderr))
    print("tampered    %-26s -> %s" % ("world 2^32 + W", errs[0][errs[0].find("--resume"):][:110]))

    # 6. bad flags
    empty = J("empty")
    os.makedirs(empty)
    p, _, _ = train(1, "grad_op", "bad_resume", ["--resume", empty, "--steps", str(STEPS)], expect_ok=False)
    check(p.returncode != 0 and empty in p.stderr, "--resume of a directory without manifest or latest: exit %d, "
          "stderr should name %s:\n%s" % (p.returncode, empty, p.stderr[-2000:]))
    print("bad flags   --resume %s: exit %d: %s" % (os.path.basename(empty), p.returncode,
                                                   p.stderr.strip().splitlines()[0][:150]))
    p, _, _ = train(4, "full", "bad_dump", ["--resume", D, "--steps", str(STEPS), "--dump-grads", J("grads")],
                    expect_ok=False)
    check(p.returncode == 2 and "--dump-grads" in p.stderr and "step 1" in p.stderr,
          "--dump-grads with --resume past step 1: exit %d, expected 2 and a message:\n%s" % (p.returncode,
                                                                                        p.stderr[-2000:]))
    print("bad flags   --dump-grads + --resume: exit 2")
    p, _, _ = train(1, "grad_op", "bad_every", ["--steps", str(STEPS), "--ckpt-dir", J("every0"),
                                                "--ckpt-every", "0"], expect_ok=False)
    check(p.returncode == 2, "--ckpt-every 0: exit %d, expected 2:\n%s" % (p.returncode, p.stderr[-2000:]))
    print("bad flags   --ckpt-every 0: exit 2: %s" % (p.stderr.strip().splitlines() or [""])[0][:150])
    links(J, train)
    print("OK checkpoint: bit-for-bit resume at world 4, resharded to world 1-4 x full/grad_op/none/hybrid:2, "
          "a killed save leaves latest intact, a corrupted shard is refused")


def links(J, train):
    """7. links planted inside --ckpt-dir are never followed; the user's own --ckpt-dir link is"""
    imp = J("important")
    os.makedirs(imp)
    for f in ("a.txt", "b.bin"):
        with open(os.path.join(imp, f), "w") as h:
            h.write("keep " + f)
    with open(J("victim"), "w") as h:
        h.write("precious")
    keep, victim = tree_hashes(imp), open(J("victim")).read()

    def intact(tag):
        check(tree_hashes(imp) == keep, "%s: the link's target %s lost or changed files: %s" % (tag, imp,
                                                                                            sorted(tree_hashes(imp))))
        check(open(J("victim")).read() == victim, "%s: the victim file was overwritten" % tag)

    ck = J("ck_links")
    os.makedirs(ck)
    os.symlink(imp, os.path.join(ck, ".step-00000001.tmp"))
    run2 = ["--steps", "2", "--ckpt-dir", ck, "--ckpt-every", "1"]
    train(2, "full", "links1", run2)
    intact("a stale .tmp that is a link")
    for s in (1, 2):
        check_ckpt(os.path.join(ck, step_name(s)), 2, "links1")
    check(read_latest(ck).strip() == step_name(2), "links1: latest does not name step 2")
    shutil.rmtree(os.path.join(ck, step_name(2)))
    os.symlink(imp, os.path.join(ck, step_name(2)))
    os.symlink(imp, os.path.join(ck, ".%s.old" % step_name(2)))
    os.unlink(os.path.join(ck, "latest"))
    os.symlink(J("victim"), os.path.join(ck, "latest"))
    train(2, "full", "links2", run2)
    intact("step-N, its .old and latest as links, saved again")
    check(not os.path.islink(os.path.join(ck, step_name(2))), "links2: step 2 is still the planted link")
    check_ckpt(os.path.join(ck, step_name(2)), 2, "links2")
    check(not os.path.islink(os.path.join(ck, "latest")) and read_latest(ck).strip() == step_name(2),
          "links2: latest is not a file naming step 2")
    check(sorted(os.listdir(ck)) == ["latest", step_name(1), step_name(2)], "links2: %s holds %s" % (
        ck, sorted(os.listdir(ck))))
    print("links       .tmp, step-N, .old and latest planted as links: replaced, their targets untouched")
    ckb = J("ck_best")
    os.makedirs(ckb)
    os.symlink(imp, os.path.join(ckb, "best"))
    p, _, _ = train(1, "grad_op", "links_best", ["--steps", "2", "--ckpt-dir", ckb, "--val-data", "x=" + J("x.npy"),
                                                  "--val-data", "target=" + J("t.npy"), "--save-best"],
                    expect_ok=False)
    errs = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 1 and len(errs) == 1 and "best" in errs[0], "--save-best with best a link: exit %d, "
          "expected 1 and one line naming best:\n%s" % (p.returncode, p.stderr[-2000:]))
    intact("best as a link")
    print("links       --save-best with best a link: %s" % errs[0][errs[0].find("error"):][:120])
    real, mine = J("ck_real"), J("ck_mine")
    os.makedirs(real)
    os.symlink(real, mine)
    train(2, "full", "links_user", ["--steps", "2", "--ckpt-dir", mine])
    check_ckpt(os.path.join(real, step_name(2)), 2, "the user's own link")
    _, m, _ = train(2, "full", "links_user_resume", ["--resume", mine, "--steps", "3", "--ckpt-dir", mine])
    check([r["step"] for r in metrics(m)] == [3], "resume through the user's own link: steps %s" % (
        [r["step"] for r in metrics(m)]))
    check(read_latest(real).strip() == step_name(3), "the user's own link: latest does not name step 3")
    print("links       --ckpt-dir as the user's own link: saved into its folder, resumed through it")
    rank0 = os.path.join(real, step_name(3), "rank-00000.bin")
    before = tree_hashes(real)
    p, _, _ = train(1, "grad_op", "links_clobber", ["--resume", mine, "--steps", "4", "--export-safetensors", rank0],
                    expect_ok=False)
    errs = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 2 and len(errs) == 1 and "is the --resume file" in errs[0] and "rank-00000.bin" in errs[0],
          "an export onto the --resume checkpoint's file: exit %d, expected 2 and one line naming both:\n%s" % (
              p.returncode, p.stderr[-2000:]))
    check(tree_hashes(real) == before, "an export onto the --resume checkpoint's file changed the checkpoint")
    print("clobber     --export-safetensors onto a --resume file: %s" % errs[0][errs[0].find("error"):][:120])


if __name__ == "__main__":
    main()
