"""The target-neutral runtime on the cuda target's TCP control plane, on the CPU.

The example MLP is built with the cpu runtime (MPI) as the reference, and with
fsdpc --cc CC_TCP, a wrapper that links the runtime core + ctl_tcp.c instead,
with the host device layer and tests/rt_comm_ctl.c (the step's collectives
through the control plane).  The TCP executables link no MPI.  At world 1,
2 (RANK/WORLD_SIZE + MASTER_ADDR/MASTER_PORT) and 3 (mpirun: the default,
Open MPI's library loaded at run time for the rendezvous — glibc's
LD_DEBUG=files shows every rank loading it) their losses and exported
weights match the reference, and so at world 3 under mpirun with
FSDPC_MPI_LIB=none (no rank loads it: the /tmp rendezvous file); an
FSDPC_MPI_LIB that does not load, or is a FIFO, is a one-line error per rank; a start-up
error on one rank is printed once, by that rank; a rank killed mid-run
takes the others down within seconds, with a message naming it.

usage: ctl_tcp_train.py FSDPC MODEL.onnx CC_TCP WORK
"""
import os
import socket
import subprocess
import sys
import time

import numpy as np

from common import check, mpirun, onnx_weights, read_metrics, rel_err, run

ROWS, GLOBAL_B, STEPS = 24, 12, 4


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(world, argv):
    """world processes of argv with RANK/WORLD_SIZE and MASTER_ADDR/MASTER_PORT"""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port,
                   FSDPC_CTL_CONNECT_TIMEOUT="30")
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        procs.append(subprocess.Popen(argv(r), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs, timeout=60):
    out = []
    for p in procs:
        o, e = p.communicate(timeout=timeout)
        out.append((p.returncode, o, e))
    return out


def main():
    fsdpc, model, cc_tcp, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    J = lambda *a: os.path.join(work, *a)
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((ROWS, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((ROWS, 1)).astype(np.float32))

    def build(exe, world, cc):
        run([fsdpc, model, "-o", exe, "--target", "cpu", "--loss", "mse:y,target", "--dim",
             "batch=%d" % (GLOBAL_B // world), "--wrap", "size:200"] + (["--cc", cc] if cc else []))

    def args(exe, tag, tfile=None):
        return [exe, "--data", "x=" + J("x.npy"), "--data", "target=" + (tfile or J("t.npy")), "--steps", str(STEPS),
                "--lr", "0.01", "--metrics", J(tag + ".jsonl"), "--export-onnx", J(tag + ".onnx"), "--quiet"]

    build(J("ref"), 1, None)
    run(args(J("ref"), "ref"))
    ref_losses, _ = read_metrics(J("ref.jsonl"))
    ref_w = onnx_weights(J("ref.onnx"))

    def mpi_loads(tag):
        """how many of our processes in tag's run dlopen'ed libmpi.so.40 (LD_DEBUG=files output: one file per
        process; ours name the executable; under ASan the loader names libasan, which intercepts dlopen)"""
        n = 0
        for f in os.listdir(J()):
            if f.startswith(tag + ".ld."):
                lines = open(J(f), errors="replace").read().splitlines()
                ours = any("tcp_w" in l for l in lines)
                n += ours and any("file=libmpi.so.40" in l and "dynamically loaded by" in l for l in lines)
        return n

    built = set()
    for world, how in ((1, "alone"), (2, "env"), (3, "mpirun"), (3, "mpirun, no MPI library: the file")):
        exe = J("tcp_w%d" % world)
        if exe not in built:
            build(exe, world, cc_tcp)
            built.add(exe)
        libs = run(["ldd", exe]).stdout
        check("libmpi" not in libs, "%s links MPI:\n%s" % (exe, libs))
        tag = "tcp_w%d_%s" % (world, how.split()[0])
        if how == "env":
            res = finish(launch(2, lambda r: args(exe, tag)))
            for r, (code, o, e) in enumerate(res):
                check(code == 0, "world 2, rank %d: exit %d\n%s" % (r, code, e[-2000:]))
        elif world > 1:
            tag += "_file" if "file" in how else ""
            for f in os.listdir(J()):
                if f.startswith(tag + ".ld."):  # an earlier run's
                    os.remove(J(f))
            env = {"LD_DEBUG": "files", "LD_DEBUG_OUTPUT": J(tag + ".ld")}
            if "file" in how:
                env["FSDPC_MPI_LIB"] = "none"
            run(mpirun(world, args(exe, tag)), env=env)
            want = 0 if "file" in how else world
            check(mpi_loads(tag) == want, "world %d (%s): %d ranks loaded libmpi.so.40, expected %d"
                  % (world, how, mpi_loads(tag), want))
        else:
            run(args(exe, tag))
        losses, mem = read_metrics(J(tag + ".jsonl"))
        check(mem is not None and mem["world"] == world, "world %d: no memory report" % world)
        check(len(losses) == STEPS, "world %d: %d losses" % (world, len(losses)))
        for s, (a, b) in enumerate(zip(losses, ref_losses)):
            check(abs(a - b) <= 1e-5 * abs(b), "world %d step %d: loss %.9g vs %.9g (MPI)" % (world, s, a, b))
        w = onnx_weights(J(tag + ".onnx"))
        for name, ref in ref_w.items():
            check(name in w and rel_err(w[name], ref) <= 1e-5, "world %d: weight '%s' differs" % (world, name))
        print("world %d (%s): losses match, %s" % (world, how, " ".join("%.6f" % l for l in losses)))

    # an MPI library that does not load: one line per rank, exit 1
    p = run(mpirun(2, args(J("tcp_w2"), "nompi")), check=False, env={"FSDPC_MPI_LIB": J("no", "libmpi.so")})
    lines = [l for l in p.stderr.splitlines() if "FSDPC_MPI_LIB=" in l]
    check(p.returncode != 0 and len(lines) == 2, "FSDPC_MPI_LIB that does not load: exit %d, stderr:\n%s"
          % (p.returncode, p.stderr[-2000:]))
    print("FSDPC_MPI_LIB that does not load:", lines[0])
    # a FIFO as the MPI library: refused at once, never opened (dlopen would wait for a writer)
    if os.path.lexists(J("libmpi.fifo")):  # a run before this one in the same folder
        os.remove(J("libmpi.fifo"))
    os.mkfifo(J("libmpi.fifo"))
    p = run(mpirun(2, args(J("tcp_w2"), "fifompi")), check=False, env={"FSDPC_MPI_LIB": J("libmpi.fifo")}, timeout=60)
    lines = [l for l in p.stderr.splitlines() if "FSDPC_MPI_LIB=" in l and "not a regular file" in l]
    check(p.returncode != 0 and len(lines) == 2, "FSDPC_MPI_LIB a FIFO: exit %d, stderr:\n%s"
          % (p.returncode, p.stderr[-2000:]))
    print("FSDPC_MPI_LIB a FIFO:", lines[0])

    # a start-up error on rank 1 only: one line, by rank 1; every rank exits 1
    exe = J("tcp_w2")
    res = finish(launch(2, lambda r: args(exe, "bad", J("missing.npy") if r == 1 else None)))
    lines = [l for _, _, e in res for l in e.splitlines() if l.strip()]
    check([c for c, _, _ in res] == [1, 1], "start-up error: exits %s" % [c for c, _, _ in res])
    check(len(lines) == 1 and "rank 1" in lines[0] and "missing.npy" in lines[0],
          "start-up error: expected one line naming rank 1 and the file, got:\n" + "\n".join(lines))
    print("start-up error on rank 1:", lines[0])

    # rank 1 killed mid-run: the others go within seconds
    exe = J("tcp_w3")
    procs = launch(3, lambda r: [exe, "--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--steps",
                                 "100000000", "--quiet"])
    time.sleep(1.5)
    check(all(p.poll() is None for p in procs), "the long run ended early: %s" % [p.poll() for p in procs])
    procs[1].kill()
    t0 = time.time()
    res = finish(procs, timeout=30)
    took = time.time() - t0
    check(took < 10, "the other ranks took %.1f s to go" % took)
    check(res[0][0] != 0 and res[2][0] != 0, "exits after the kill: %s" % [c for c, _, _ in res])
    check("rank 1" in res[0][2], "rank 0 does not name rank 1:\n" + res[0][2][-2000:])
    print("rank 1 killed: the others exited %s within %.1f s; rank 0: %s" %
          ([res[0][0], res[2][0]], took, res[0][2].strip().splitlines()[-1]))
    print("ok")


if __name__ == "__main__":
    main()
