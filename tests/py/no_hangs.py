"""Ranks that disagree or fail never hang: every rank exits non-zero with a clear message, in bounded time.

usage: no_hangs.py FSDPC WORKDIR

The MLP (examples/mlp.onnx) on the CPU target at world 2 under mpirun, each
case with a 60 s limit (a hang would hit it) and a measured exit time:
  - another executable on rank 1 (MPMD: a build of another batch size): the
    start-up handshake names the two executables' keys;
  - another --data file on rank 1: "this rank's --data files differ";
  - a data file missing on rank 1 only: one line by rank 1 naming the file;
  - a label out of range read by rank 1 at step 3: the step failure names the
    step and rank and every rank stops;
  - rank 1 killed (SIGKILL) mid-run: mpirun ends the others;
  - --resume of a checkpoint only rank 0 can read (rank 1 points at an empty
    directory): every rank stops at start-up.
Files that are not regular files are refused at once, never read (a FIFO
without a writer would block the open, /dev/zero never ends), with one line
naming the flag and the file and "not a regular file": a FIFO as --data on
rank 1 only (world 2), and at world 1 a FIFO as --data, /dev/zero as --data,
a FIFO as --init, as a checkpoint's manifest, as a --ckpt-dir's latest and as
a checkpoint's rank-00000.bin (each --resume).
"""
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np

from common import check, run

LIMIT = 60


def mpmd(*parts):
    """mpirun of one rank per argv in parts"""
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe"]
    for i, argv in enumerate(parts):
        cmd += ([":"] if i else []) + ["-np", "1"] + argv
    return cmd


def expect_fail(tag, cmd, *needles):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        check(False, "%s: still running after %d s (a hang): %s" % (tag, LIMIT, " ".join(cmd)))
    took = time.time() - t0
    check(p.returncode != 0, "%s: exit 0, expected a failure" % tag)
    for n in needles:
        check(n in p.stderr, "%s: stderr lacks %r:\n%s" % (tag, n, p.stderr[-2000:]))
    line = next((l for l in p.stderr.splitlines() if all(n in l for n in needles[:1])), "")
    print("%-28s exit %d after %4.1f s: %s" % (tag, p.returncode, took, line.strip()[:130]))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    model = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "mlp.onnx")
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    np.save(J("x2.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    for b in (6, 4):
        run([fsdpc, model, "-o", J("mlp_b%d" % b), "--target", "cpu", "--loss", "mse:y,target", "--dim",
             "batch=%d" % b, "--wrap", "size:600"])
    exe = J("mlp_b6")
    data = ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy")]
    args = data + ["--steps", "5", "--quiet"]

    expect_fail("another executable", mpmd([exe] + args, [J("mlp_b4")] + args), "same one")
    expect_fail("another --data file", mpmd([exe] + args, [exe, "--data", "x=" + J("x2.npy"), "--data",
                                                           "target=" + J("t.npy"), "--steps", "5", "--quiet"]),
                "differ")
    expect_fail("a file missing on rank 1", mpmd([exe] + args, [exe, "--data", "x=" + J("nope.npy"), "--data",
                                                                 "target=" + J("t.npy"), "--steps", "5"]),
                "nope.npy")
    # a long run, then rank 1 is killed
    proc = subprocess.Popen(mpmd([exe] + data + ["--steps", "100000000", "--quiet"],
                                 [exe] + data + ["--steps", "100000000", "--quiet"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2)
    check(proc.poll() is None, "the long run ended early")
    pids = subprocess.run(["pgrep", "-f", exe], capture_output=True, text=True).stdout.split()
    ranks = [int(p) for p in pids if int(p) != proc.pid]
    check(len(ranks) >= 2, "expected two rank processes, found %s" % pids)
    os.kill(max(ranks), signal.SIGKILL)
    t0 = time.time()
    try:
        _, err = proc.communicate(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        check(False, "killing one rank left the other running for %d s" % LIMIT)
    check(proc.returncode != 0, "a killed rank: mpirun exited 0")
    print("%-28s exit %d after %4.1f s" % ("a rank killed mid-run", proc.returncode, time.time() - t0))
    # a checkpoint rank 0 reads and rank 1 cannot
    run([exe] + data + ["--steps", "2", "--ckpt-dir", J("ck"), "--quiet"])
    os.makedirs(J("empty"), exist_ok=True)
    expect_fail("--resume unreadable on rank 1", mpmd([exe] + args + ["--resume", J("ck")],
                                                      [exe] + args + ["--resume", J("empty")]), "--resume")
    # special files: refused, never read
    os.mkfifo(J("fifo"))
    bad = "not a regular file"
    expect_fail("a FIFO as --data on rank 1", mpmd([exe] + args, [exe, "--data", "x=" + J("fifo"), "--data",
                                                                  "target=" + J("t.npy"), "--steps", "5"]),
                "--data x: " + J("fifo") + ": " + bad)
    expect_fail("a FIFO as --data", [exe, "--data", "x=" + J("fifo"), "--data", "target=" + J("t.npy")],
                "--data x: " + J("fifo") + ": " + bad)
    expect_fail("/dev/zero as --data", [exe, "--data", "x=/dev/zero", "--data", "target=" + J("t.npy")],
                "--data x: /dev/zero: " + bad)
    expect_fail("a FIFO as --init", [exe] + args + ["--init", J("fifo")], "--init " + J("fifo") + ": " + bad)
    for what in ("manifest", "latest", "rank-00000.bin"):
        d = J("ck_" + what)
        shutil.copytree(J("ck"), d)
        f = os.path.join(d, what if what == "latest" else os.path.join("step-00000002", what))
        os.remove(f)
        os.mkfifo(f)
        expect_fail("a FIFO as a checkpoint's " + what, [exe] + args + ["--resume", d], "--resume", f + ": " + bad)
    print("OK no_hangs: every disagreement and failure ends every rank with a message")


if __name__ == "__main__":
    main()
