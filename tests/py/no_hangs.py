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
  - rank 1 stopped (SIGSTOP) mid-run (once rank 0 has recorded a step),
    FSDPC_STEP_TIMEOUT=5, the collectives inside the step and on the
    communication thread: rank 0's watchdog ends the job within 15 s with one
    line naming itself, the step, the collective and rank 1 as not responding;
  - rank 1 stopped before MPI_Init, FSDPC_START_TIMEOUT=5: rank 0's start-up
    guard ends it within 20 s with one line naming MPI_Init;
  - rank 0 blocked in a system call (opening a --metrics FIFO nobody reads)
    while rank 1 waits at start-up: rank 1's line names rank 0, which answers
    from its watchdog thread, with where it is;
  - FSDPC_STEP_TIMEOUT that is not a number of seconds ('5s', '', 'inf'), and
    FSDPC_START_TIMEOUT '5s': one line, every rank exits 1;
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
import re
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


def rank_pid(exe, rank):
    """the pid of the process of exe that mpirun started as rank"""
    for d in os.listdir("/proc"):
        try:
            env = open("/proc/%s/environ" % d, "rb").read().split(b"\0")
            argv = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
        except (OSError, ValueError):
            continue
        if argv[0] == exe.encode() and ("OMPI_COMM_WORLD_RANK=%d" % rank).encode() in env:
            return int(d)
    return None


def stepping(proc, metrics, tag):
    """waits until rank 0's --metrics file holds a step's record: both ranks are past start-up (a rank stopped
    before that is start-up's guard's case; a fixed sleep was not enough on a loaded machine)"""
    t0 = time.time()
    while time.time() - t0 < LIMIT:
        check(proc.poll() is None, "%s: the long run ended early" % tag)
        try:
            with open(metrics) as f:
                if '"step"' in f.read():
                    return
        except OSError:
            pass
        time.sleep(0.05)
    check(False, "%s: no step recorded in %d s" % (tag, LIMIT))


def stalled_rank(exe, data, comm_thread, metrics):
    """rank 1 stopped mid-run: rank 0's watchdog names it and the job ends"""
    tag = "rank 1 stopped (%s)" % ("comm thread" if comm_thread == "1" else "in the step")
    env = dict(os.environ, FSDPC_STEP_TIMEOUT="5", FSDPC_COMM_THREAD=comm_thread)
    if os.path.exists(metrics):
        os.unlink(metrics)
    proc = subprocess.Popen(mpmd([exe] + data + ["--steps", "100000000", "--log-every", "100000000", "--metrics",
                                                 metrics],
                                 [exe] + data + ["--steps", "100000000"]),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    pid = None
    try:
        stepping(proc, metrics, tag)
        pid = rank_pid(exe, 1)
        check(pid is not None, "%s: no process of rank 1" % tag)
        os.kill(pid, signal.SIGSTOP)
        t0 = time.time()
        out, err = proc.communicate(timeout=LIMIT)
        took = time.time() - t0
    except subprocess.TimeoutExpired:
        check(False, "%s: the job still ran %d s after rank 1 stopped" % (tag, LIMIT))
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    check(proc.returncode != 0, "%s: mpirun exited 0" % tag)
    check(took < 15, "%s: the job took %.1f s to end (FSDPC_STEP_TIMEOUT=5)" % (tag, took))
    want = "communication thread" if comm_thread == "1" else "inside the step"
    check(want in out, "%s: expected the collectives %s:\n%s" % (tag, want, out[-1000:]))
    pat = (r"error: rank 0: step \d+: collective '[^']+ \((AllGather|ReduceScatter|AllReduce)\)' made no "
           r"progress for 5 s \(FSDPC_STEP_TIMEOUT\): did not arrive: rank 1 not responding \(stopped")
    lines = [l for l in err.splitlines() if "FSDPC_STEP_TIMEOUT" in l]
    check(len(lines) == 1 and re.search(pat, lines[0]), "%s: expected one line matching %r:\n%s" % (tag, pat, err))
    print("%-28s exit %d after %4.1f s: %s" % (tag, proc.returncode, took, lines[0].strip()[:150]))


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
    # a rank that stops: the watchdog names it, in the step and on the communication thread
    stalled_rank(exe, data, "0", J("stalled.jsonl"))
    stalled_rank(exe, data, "1", J("stalled.jsonl"))
    # rank 1 stopped before its MPI_Init (a shell that stops itself, then runs it): rank 0 waits inside MPI_Init,
    # where no watchdog runs yet; start-up's guard (FSDPC_START_TIMEOUT) ends it with one line, mpirun the job
    env = dict(os.environ, FSDPC_START_TIMEOUT="5")
    t0 = time.time()
    try:
        p = subprocess.run(mpmd([exe] + args, ["sh", "-c", 'kill -STOP $$; exec "$0" "$@"', exe] + args),
                           capture_output=True, text=True, timeout=LIMIT, env=env)
    except subprocess.TimeoutExpired:
        check(False, "rank 1 stopped at start-up: the job still ran %d s later" % LIMIT)
    took = time.time() - t0
    pat = (r"error: rank 0: start-up: MPI_Init made no progress for 5 s \(FSDPC_START_TIMEOUT\): another rank did "
           r"not arrive")
    lines = [l for l in p.stderr.splitlines() if "FSDPC_START_TIMEOUT" in l]
    check(p.returncode != 0 and took < 20 and len(lines) == 1 and re.search(pat, lines[0]),
          "rank 1 stopped at start-up: exit %d after %.1f s, expected one line matching %r:\n%s"
          % (p.returncode, took, pat, p.stderr[-2000:]))
    print("%-28s exit %d after %4.1f s: %s" % ("rank 1 stopped at start-up", p.returncode, took, lines[0].strip()[:150]))
    # rank 0 blocked in open() of a FIFO: rank 1 times out at start-up, rank 0's watchdog answers
    os.mkfifo(J("metrics.fifo"))
    env = dict(os.environ, FSDPC_STEP_TIMEOUT="3")
    t0 = time.time()
    p = subprocess.run(mpmd([exe] + args + ["--metrics", J("metrics.fifo")], [exe] + args), capture_output=True, text=True,
                       timeout=LIMIT, env=env)
    took = time.time() - t0
    check(p.returncode != 0 and took < 15, "a rank blocked: exit %d after %.1f s" % (p.returncode, took))
    pat = (r"error: rank 1: start-up: the control plane's \w+ made no progress for 3 s \(FSDPC_STEP_TIMEOUT\): did "
           r"not arrive: rank 0 is at start-up, outside any collective")
    check(re.search(pat, p.stderr), "a rank blocked: stderr lacks %r:\n%s" % (pat, p.stderr))
    print("%-28s exit %d after %4.1f s" % ("rank 0 blocked in open()", p.returncode, took))
    # a timeout that is not a number of seconds (set but empty, never, 5s): one line
    for var, bad_t in [("FSDPC_STEP_TIMEOUT", v) for v in ("5s", "", "inf")] + [("FSDPC_START_TIMEOUT", "5s")]:
        env = dict(os.environ, **{var: bad_t})
        p = subprocess.run(mpmd([exe] + args, [exe] + args), capture_output=True, text=True, timeout=LIMIT, env=env)
        lines = [l for l in p.stderr.splitlines() if var in l]
        check(p.returncode != 0 and len(lines) == 1 and "%s='%s': expected a number of seconds > 0"
              % (var, bad_t) in lines[0], "%s=%r: exit %d, expected one line:\n%s" % (var, bad_t, p.returncode,
                                                                                   p.stderr))
        print("%-28s exit %d: %s" % ("%s=%r" % (var, bad_t), p.returncode, lines[0].strip()))
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
