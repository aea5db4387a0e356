"""Under Slurm: srun launches the executable as mpirun does.

usage: slurm.py FSDPC CC_TCP WORKDIR   (as root: slurmd starts the tasks)

A real Slurm made here: slurmctld and slurmd from Debian's slurm-wlm, one node on loopback (this host, 4 CPUs
declared so 4 tasks fit on 2 cores), their own ports, state and spool under WORKDIR, auth/none.  Checked:
- `srun --mpi=pmix -n W EXE` (Open MPI's ranks from Slurm's PMIx server, no mpirun): a GPT (examples/gpt.py,
  --tokens) at W = 2 --shard full and W = 4 hybrid:2: losses, gradient norms and exported weights
  bit-identical to the same executable under `mpirun -np W`; the start line says "ranks: W on 1 host";
- the cuda target's control plane (ctl_tcp.c on the CPU through CC_TCP, no MPI linked): ranks from
  SLURM_PROCID/SLURM_NTASKS, the rendezvous through Open MPI loaded at run time: the MLP at W = 3 equals
  the MPI runtime's world-3 run within 1e-6;
- a rank killed (SIGKILL) mid-run under srun, and one stopped (SIGSTOP: its peer's watchdog names it with
  FSDPC_STEP_TIMEOUT=5 and calls MPI_Abort, on which Slurm ends the step): the job ends within 20 s, non-zero,
  and Slurm's queue (squeue) is empty afterwards.
"""
import copy
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from common import check, onnx_weights, rel_err, run  # noqa: E402

STEPS = 6


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rows(path):
    return [json.loads(l) for l in open(path) if '"step"' in l]


class Slurm:
    """slurmctld + slurmd on loopback, configured under work"""

    def __init__(self, work):
        self.work = work
        self.conf = os.path.join(work, "slurm.conf")
        self.node = socket.gethostname().split(".")[0]
        self.procs = []

    def __enter__(self):
        W = lambda *p: os.path.join(self.work, *p)
        for d in ("state", "spool"):
            os.makedirs(W(d), exist_ok=True)
        with open(self.conf, "w") as f:
            f.write("""ClusterName=fsdpctest
SlurmctldHost={node}(127.0.0.1)
SlurmctldPort={p1}
SlurmdPort={p2}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation={w}/state
SlurmdSpoolDir={w}/spool
SlurmctldPidFile={w}/slurmctld.pid
SlurmdPidFile={w}/slurmd.pid
SlurmctldLogFile={w}/slurmctld.log
SlurmdLogFile={w}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName={node} NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
""".format(node=self.node, p1=free_port(), p2=free_port(), w=self.work))
        self.env = dict(os.environ, SLURM_CONF=self.conf)
        for k in [k for k in self.env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
            del self.env[k]  # this test may itself run inside a Slurm job
        try:
            for cmd in (["slurmctld", "-D", "-i", "-f", self.conf], ["slurmd", "-D", "-N", self.node, "-f", self.conf]):
                self.procs.append(subprocess.Popen(cmd, env=self.env, stdout=subprocess.DEVNULL,
                                                   stderr=subprocess.DEVNULL, start_new_session=True))
            t0 = time.time()
            while True:
                p = subprocess.run(["sinfo", "-h", "-o", "%t"], env=self.env, capture_output=True, text=True)
                if p.returncode == 0 and p.stdout.strip() == "idle":
                    break
                check(all(q.poll() is None for q in self.procs) and time.time() - t0 < 60,
                      "slurm did not come up (sinfo: %r %r); logs in %s" % (p.stdout, p.stderr, self.work))
                time.sleep(0.5)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc):
        if self.procs and self.procs[0].poll() is None:  # this private cluster's jobs, all of them
            subprocess.run(["scancel", "-p", "test"], env=self.env, capture_output=True, timeout=30)
            t0 = time.time()
            while time.time() - t0 < 15:
                p = subprocess.run(["squeue", "-h"], env=self.env, capture_output=True, text=True, timeout=30)
                if p.returncode != 0 or not p.stdout.strip():
                    break
                time.sleep(0.5)
        for q in self.procs:
            if q.poll() is None:
                os.killpg(q.pid, signal.SIGTERM)
        for q in self.procs:
            try:
                q.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(q.pid, signal.SIGKILL)
                q.wait()

    def srun(self, n, argv):
        return ["srun", "--mpi=pmix", "-n", str(n)] + argv


def main():
    fsdpc, cc_tcp, work = sys.argv[1:4]
    if os.geteuid() != 0:
        print("SKIPPED: slurmd must run as root to start the tasks")
        sys.exit(77)
    for tool in ("slurmctld", "slurmd", "srun", "sinfo"):
        check(shutil.which(tool) is not None, "%s is not installed: scripts/setup.sh --test installs Debian's "
              "slurmctld, slurmd and slurm-client" % tool)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)

    import torch
    from gpt import GPT, GPTConfig, export
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0, tied=True))
    export(copy.deepcopy(gpt), J("gpt.onnx"), 4, 16)
    rng = np.random.default_rng(0)
    rng.integers(0, 64, 16 * 48 + 1).astype("<u2").tofile(J("tokens.bin"))
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    gpt_build = [J("gpt.onnx"), "--loss", "cross_entropy:logits,labels", "--wrap", "size:9000"]
    mlp_build = [os.path.join(ROOT, "examples", "mlp.onnx"), "--loss", "mse:y,target", "--wrap", "size:600"]
    gpt_data = ["--tokens", J("tokens.bin"), "--lr", "1e-3"]
    mlp_data = ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--lr", "1e-3"]
    train = ["--steps", str(STEPS), "--clip-grad-norm", "1e9"]
    mpirun = lambda n, argv: ["mpirun", "--oversubscribe", "-np", str(n)] + argv

    def build(tag, model, world, extra=()):
        exe = J(tag)
        run([fsdpc] + model[:1] + ["-o", exe, "--target", "cpu", "--dim", "batch=%d" % (12 // world)] + model[1:]
            + list(extra))
        return exe

    def outputs(exe, tag):
        return [exe] + train + ["--metrics", J(tag + ".jsonl"), "--export-onnx", J(tag + ".onnx")]

    with Slurm(J("slurm")) as slurm:
        for tag, world, extra in (("gpt_full", 2, []), ("gpt_hybrid", 4, ["--shard", "hybrid:2"])):
            exe = build(tag, gpt_build, world, extra)
            run(mpirun(world, outputs(exe, tag + "_mpirun") + gpt_data))
            p = run(slurm.srun(world, outputs(exe, tag) + gpt_data), env=slurm.env, timeout=300)
            want = "ranks: %d on 1 host" % world
            check(want in p.stdout, "%s: srun's output lacks %r:\n%s" % (tag, want, p.stdout[:2000]))
            a, b = rows(J(tag + ".jsonl")), rows(J(tag + "_mpirun.jsonl"))
            check(len(a) == STEPS and [(r["loss"], r["grad_norm"]) for r in a] == [(r["loss"], r["grad_norm"])
                                                                                  for r in b],
                  "%s: losses under srun %s, under mpirun %s" % (tag, [r["loss"] for r in a], [r["loss"] for r in b]))
            wa, wb = onnx_weights(J(tag + ".onnx")), onnx_weights(J(tag + "_mpirun.onnx"))
            for k in wb:
                check(np.array_equal(wa[k], wb[k]), "%s: weight %s differs from mpirun's by %.3g"
                      % (tag, k, rel_err(wa[k], wb[k])))
            print("srun -n %d %-10s %d steps bit-identical to mpirun -np %d" % (world, tag, STEPS, world))

        # the cuda target's control plane under srun
        ref = build("mlp_w3", mlp_build, 3)
        run(mpirun(3, outputs(ref, "tcp_ref") + mlp_data))
        exe = build("mlp_tcp", mlp_build, 3, ["--cc", cc_tcp])
        p = run(slurm.srun(3, outputs(exe, "tcp") + mlp_data), env=slurm.env, timeout=300)
        check("ranks: 3 on 1 host" in p.stdout, "ctl_tcp under srun: the output lacks 'ranks: 3 on 1 host':\n%s"
              % p.stdout[:2000])
        a, b = rows(J("tcp.jsonl")), rows(J("tcp_ref.jsonl"))
        check(len(a) == STEPS and all(abs(x["loss"] - y["loss"]) <= 1e-6 * abs(y["loss"]) for x, y in zip(a, b)),
              "ctl_tcp under srun: losses %s, the MPI runtime's %s" % ([r["loss"] for r in a], [r["loss"] for r in b]))
        wa, wb = onnx_weights(J("tcp.onnx")), onnx_weights(J("tcp_ref.onnx"))
        for k in wb:
            e = rel_err(wa[k], wb[k])
            check(e <= 1e-6, "ctl_tcp under srun: weight %s differs from the MPI runtime's by %.3g" % (k, e))
        print("srun -n 3 mlp_tcp    %d steps = the MPI runtime's world-3 run within 1e-6" % STEPS)

        # a rank killed mid-run; a rank stopped mid-run (a half-dead job: rank 0's watchdog names it and calls
        # MPI_Abort, on which Slurm's PMIx plugin ends the step, the stopped rank included)
        exe = J("gpt_full")
        env = dict(slurm.env, FSDPC_STEP_TIMEOUT="5")
        for sig, what in ((signal.SIGKILL, "killed"), (signal.SIGSTOP, "stopped")):
            proc = subprocess.Popen(slurm.srun(2, [exe] + gpt_data + ["--steps", "100000000", "--log-every",
                                                                      "100000000"]),
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            victim = None
            try:
                time.sleep(3)
                if proc.poll() is not None:
                    check(False, "the long run under srun ended early: %s" % proc.communicate()[1][-2000:])
                for d in os.listdir("/proc"):
                    try:
                        env_d = open("/proc/%s/environ" % d, "rb").read().split(b"\0")
                        argv = open("/proc/%s/cmdline" % d, "rb").read().split(b"\0")
                    except OSError:
                        continue
                    if argv[0] == exe.encode() and b"SLURM_PROCID=1" in env_d:
                        victim = int(d)
                check(victim is not None, "no process of rank 1 under srun")
                os.kill(victim, sig)
                t0 = time.time()
                out, err = proc.communicate(timeout=60)
                took = time.time() - t0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
                if victim is not None and sig == signal.SIGSTOP and os.path.exists("/proc/%d" % victim):
                    os.kill(victim, signal.SIGKILL)
            check(proc.returncode != 0 and took < 20, "rank 1 %s under srun: exit %d after %.1f s"
                  % (what, proc.returncode, took))
            pat = "rank 0: step "
            check(sig == signal.SIGKILL or (pat in err and "rank 1 not responding" in err),
                  "rank 1 stopped under srun: stderr lacks rank 0's watchdog line naming it:\n" + err[-2000:])
            print("srun -n 2, rank 1 %s: exit %d after %.1f s: %s" % (
                what, proc.returncode, took, (err.strip().splitlines() or [""])[0][:150]))
            # the job leaves the queue once slurmd has reaped its step (a stopped rank's kill takes a moment:
            # state CG, completing): empty within 30 s, polled
            for _ in range(60):
                p = subprocess.run(["squeue", "-h"], env=slurm.env, capture_output=True, text=True)
                if p.returncode != 0 or not p.stdout.strip():
                    break
                time.sleep(0.5)
            check(p.returncode == 0 and not p.stdout.strip(), "jobs left in Slurm's queue after 30 s: %r %r"
                  % (p.stdout, p.stderr))
    print("slurm: OK")


if __name__ == "__main__":
    main()
