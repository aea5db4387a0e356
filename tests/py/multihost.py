"""Across hosts: the executable trains on several hosts under Open MPI over TCP as it does on one.

usage: multihost.py FSDPC CC_TCP WORKDIR   (as root: it makes network namespaces)

The hosts are network namespaces made here: each has its own hostname (a UTS namespace), its own /etc/hosts
naming every host (ip netns exec's /etc/netns/NS/), and one link, eth0 with 10.250.0.(i+1)/24, a veth pair to
a bridge in a switch namespace.  Nothing connects them to this machine's own network or loopback, so every
byte between ranks on different hosts crosses those links.  mpirun runs on host 0 and reaches the others
through a stand-in for ssh (plm_rsh_agent: `ip netns exec NS` in place of `ssh HOST`), as on a cluster,
with oob and btl tcp restricted to 10.250.0.0/24; like ssh, the stand-in starts Open MPI's daemon with a clean
environment (the variables the ranks need go by mpirun -x).  Checked:
- a GPT (examples/gpt.py, 2 layers; --tokens) on 2 hosts x 2 ranks, --shard full and hybrid:2 (shards inside
  a host, replicas across the hosts), and the MLP (--data) on 3 hosts x 1 rank: the losses, gradient norms and
  exported weights are bit-identical to the same executable under `mpirun -np W` on this one host;
- each host's link received at least steps x (the parameter bytes its ranks gather from the other hosts; for
  hybrid:2 half the model, its gradients averaged across the hosts): the tensors really travelled between hosts;
- the executable's start line counts the hosts: "ranks: 4 on 2 hosts (fsdpc-node0: 2, fsdpc-node1: 2)";
- the watchdog across hosts: rank 0, alone on host 0, blocked in open() of a FIFO while ranks 1-3 on host 1
  wait at start-up; the first of them to time out names rank 0 as "at start-up, outside any collective", which it learned from rank 0's
  watchdog thread over UDP to host 0 (a peer it could not reach would be "not responding");
- the cuda target's control plane (ctl_tcp.c, here on the CPU through CC_TCP as in runtime_tcp_train):
  the MLP on 2 hosts x 2 ranks, its rendezvous through Open MPI (rank 0's hostname and port): the same
  losses and weights as the MPI runtime's world-4 run within 1e-6;
- host 1 cut off mid-run (its link pulled out of the switch), 2 ranks on host 0 and 1 on host 1: before the cut,
  the watchdog's UDP sockets are bound to 127.0.0.1 and the host's own address only, and a question with a
  wrong token from host 2 (which runs no rank) or from a process on host 0 gets no answer; then, with
  FSDPC_STEP_TIMEOUT=3 and the hosts' net.ipv4.tcp_retries2=5, a rank on host 0 names rank 2 "not responding",
  and mpirun (exit non-zero), every rank and both hosts' daemons are gone within 120 s; again with Open MPI's
  daemon keepalive (oob_tcp_keepalive_* 2 + 3 x 1 s) and the default timeout: mpirun reports the lost daemon on
  fsdpc-node1 and the whole job ends.  Every wait is bounded: a job that does not end fails the test.
Skips (exit 77, printed) only when this machine refuses to make network namespaces (not root, no iproute2).
"""
import copy
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from common import check, onnx_weights, rel_err, run  # noqa: E402

NET = "10.250.0"
PREFIX = "fsdpc-mh"
STEPS = 6


def sh(*cmd, check_rc=True):
    p = subprocess.run(list(cmd), capture_output=True, text=True, timeout=60)
    if check_rc and p.returncode != 0:
        raise SystemExit("FAILED (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr))
    return p


class Hosts:
    """n hosts: network namespaces PREFIX-PID-i with hostnames fsdpc-node<i>, linked through a bridge"""

    def __init__(self, n, work):
        self.n, self.work = n, work
        self.tag = "%s-%d" % (PREFIX, os.getpid())
        self.ns = ["%s-%d" % (self.tag, i) for i in range(n)]
        self.sw = self.tag + "-sw"
        self.names = ["fsdpc-node%d" % i for i in range(n)]
        self.addrs = ["%s.%d" % (NET, i + 1) for i in range(n)]
        self.agent = os.path.join(work, "agent.sh")

    def __enter__(self):
        try:
            sh("ip", "netns", "add", self.sw)
            sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.sw, "link", "set", "br0", "up")
            hosts = "127.0.0.1 localhost\n" + "".join("%s %s\n" % a for a in zip(self.addrs, self.names))
            for i, ns in enumerate(self.ns):
                sh("ip", "netns", "add", ns)
                os.makedirs("/etc/netns/" + ns, exist_ok=True)
                with open("/etc/netns/%s/hosts" % ns, "w") as f:
                    f.write(hosts)
                sh("ip", "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", "p%d" % i,
                   "netns", self.sw)
                sh("ip", "-n", self.sw, "link", "set", "p%d" % i, "master", "br0", "up")
                sh("ip", "-n", ns, "addr", "add", self.addrs[i] + "/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.__exit__()
            raise
        # mpirun's stand-in for ssh: `AGENT HOST COMMAND` runs COMMAND on HOST (its namespace and hostname)
        cases = "".join("  %s|%s) ns=%s; name=%s ;;\n" % (name, addr, ns, name)
                        for name, addr, ns in zip(self.names, self.addrs, self.ns))
        with open(self.agent, "w") as f:
            f.write("#!/bin/sh\n# ssh HOST COMMAND for the test's hosts\nh=$1; shift\ncase \"$h\" in\n%s"
                    "  *) echo \"agent: no host $h\" >&2; exit 255 ;;\nesac\n"
                    "exec ip netns exec \"$ns\" env -i PATH=\"$PATH\" HOME=\"$HOME\" unshare --uts sh -c 'hostname \"$0\" && exec sh -c \"$*\"' "
                    "\"$name\" \"$@\"\n" % cases)
        os.chmod(self.agent, 0o755)
        return self

    def __exit__(self, *exc):
        for ns in self.ns + [self.sw]:
            for pid in sh("ip", "netns", "pids", ns, check_rc=False).stdout.split():
                try:
                    os.kill(int(pid), 9)
                except (ProcessLookupError, ValueError):
                    pass
            sh("ip", "netns", "del", ns, check_rc=False)
            shutil.rmtree("/etc/netns/" + ns, ignore_errors=True)

    def on(self, i, argv):
        """argv run on host i"""
        return ["ip", "netns", "exec", self.ns[i], "unshare", "--uts", "sh", "-c",
                'hostname "$0" && exec "$@"', self.names[i]] + argv

    def mpirun(self, per_host, apps, env=None, opts=()):
        """mpirun on host 0 placing per_host[i] ranks on host i, with opts, then the MPMD parts of apps"""
        hostfile = os.path.join(self.work, "hostfile")
        with open(hostfile, "w") as f:
            f.write("".join("%s slots=%d\n" % (h, k) for h, k in zip(self.names, per_host) if k))
        cmd = ["mpirun", "--hostfile", hostfile, "--mca", "plm_rsh_agent", self.agent,
               "--mca", "oob_tcp_if_include", NET + ".0/24", "--mca", "btl", "tcp,vader,self",
               "--mca", "btl_tcp_if_include", NET + ".0/24"] + list(opts)
        xs = []  # per app context: -x before the first ':' does not reach the others
        # OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE: some machines of this project's kind set them (OpenBLAS's Haswell
        # kernels, which sum differently from the ones it picks by itself there): a rank on another host must run
        # the kernels the one-host run does
        for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "FSDPC_STEP_TIMEOUT", "ASAN_OPTIONS",
                  "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"):
            xs += ["-x", v] if v in (env or os.environ) else []
        for k, argv in enumerate(apps):
            cmd += ([":"] if k else []) + xs + argv
        return self.on(0, cmd)

    def pids(self, i):
        """the processes in host i's namespace"""
        return sh("ip", "netns", "pids", self.ns[i], check_rc=False).stdout.split()

    def cut(self, i, up=False):
        """host i's link pulled out of the switch (both ends see no carrier; nothing crosses), or put back (and
        host 0 reaches it again, within 30 s)"""
        sh("ip", "-n", self.sw, "link", "set", "p%d" % i, "up" if up else "down")
        t0 = time.time()
        reach = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 9), 1)\n"
                 "except ConnectionRefusedError:\n    pass\n")  # refused: it answered
        while up and sh(*self.on(0, ["/usr/bin/python3", "-c", reach, self.addrs[i]]), check_rc=False).returncode:
            check(time.time() - t0 < 30, "host %d's link is back, but host 0 does not reach it" % i)

    def rx_bytes(self, i):
        o = json.loads(sh("ip", "-j", "-s", "-n", self.ns[i], "link", "show", "dev", "eth0").stdout)
        return o[0]["stats64"]["rx"]["bytes"]


def clean_stale():
    """namespaces left by a run of this test that was killed"""
    for line in sh("ip", "netns", "list", check_rc=False).stdout.splitlines():
        m = re.match(r"(%s-(\d+)-\S+)" % PREFIX, line)
        if m and not os.path.exists("/proc/" + m.group(2)):
            sh("ip", "netns", "del", m.group(1), check_rc=False)
            shutil.rmtree("/etc/netns/" + m.group(1), ignore_errors=True)


# a question to the watchdog (runtime/wd_mpi.c's Msg): magic "WASK", the sender's rank, the job's token (here a
# guess), a nonce, the record's fields zero; sent to every address given, once per rank, from the namespace it runs
# in; prints the number of datagrams that came back within a second
PROBE = r"""
import select, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for target in sys.argv[2:]:
    host, port = target.rsplit(":", 1)
    for rank in range(int(sys.argv[1])):
        s.sendto(struct.pack("<IiQQqqiiq", 0x4b534157, rank, 0x5eed, 7 + rank, 0, 0, 0, 0, 0), (host, int(port)))
n, end = 0, time.time() + 1
while select.select([s], [], [], max(0.0, end - time.time()))[0]:
    s.recv(256)
    n += 1
print(n)
"""


def udp_sockets(hosts, i, name):
    """the local addresses ("A.B.C.D:PORT") of the UDP sockets of the processes called name on host i"""
    out = sh("ip", "netns", "exec", hosts.ns[i], "ss", "-uanpH").stdout
    return sorted(l.split()[3] for l in out.splitlines() if '"%s"' % name in l)


def wait_until(what, cond, limit):
    """cond() true within limit seconds, else FAILED naming what"""
    t0 = time.time()
    while not cond():
        check(time.time() - t0 < limit, "%s: not within %d s" % (what, limit))
        time.sleep(0.2)


def ends(hosts, proc, limit):
    """seconds until proc (mpirun) has exited and no process is left on hosts 0 and 1; FAILED (naming what is
    left) past limit"""
    t0 = time.time()
    while proc.poll() is None or hosts.pids(0) or hosts.pids(1):
        if time.time() - t0 > limit:
            left = [open("/proc/%s/comm" % q).read().strip() for i in (0, 1) for q in hosts.pids(i)
                    if os.path.exists("/proc/" + q)]
            check(False, "the job has not ended %d s after host 1 was cut off: mpirun %s, left on the hosts: %s"
                  % (limit, "running" if proc.poll() is None else "exited %d" % proc.returncode, left))
        time.sleep(0.2)
    return time.time() - t0


def run_cut(hosts, work, per_host, argv, env, opts=(), before=None):
    """argv under mpirun (opts) until its ranks' watchdog sockets are up on hosts 0 and 1; before(), then host 1
    cut off; returns mpirun's exit status, the seconds until the whole job ended, and its stderr.  The output
    goes to files: Open MPI's daemons hold copies of mpirun's output pipes after it exits."""
    name = os.path.basename(argv[0])[:15]
    err = os.path.join(work, "cut.err")
    socks = [k * (2 if k > 1 else 1) for k in per_host]  # a rank with a peer on its host has a loopback socket too
    with open(os.path.join(work, "cut.out"), "w") as o, open(err, "w") as e:
        proc = subprocess.Popen(hosts.mpirun(per_host, [argv], env=env, opts=opts), stdout=o, stderr=e,
                                env=dict(os.environ, **env))
    try:
        wait_until("the ranks' watchdog sockets on hosts 0 and 1", lambda: proc.poll() is not None or (
            len(udp_sockets(hosts, 0, name)) >= socks[0] and len(udp_sockets(hosts, 1, name)) >= socks[1]), 120)
        check(proc.poll() is None, "the long run ended early:\n" + open(err).read()[-3000:])
        if before:
            before()
        hosts.cut(1)
        took = ends(hosts, proc, 120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hosts.cut(1, up=True)
    return proc.returncode, took, open(err).read()


def rows(path):
    return [json.loads(l) for l in open(path) if '"step"' in l]


def main():
    fsdpc, cc_tcp, work = sys.argv[1:4]
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("unshare"):
        print("SKIPPED: making network namespaces needs root, ip (iproute2) and unshare")
        sys.exit(77)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    clean_stale()
    probe = "%s-%d-probe" % (PREFIX, os.getpid())
    p = sh("ip", "netns", "add", probe, check_rc=False)
    if p.returncode != 0:
        print("SKIPPED: this machine refuses network namespaces: %s" % p.stderr.strip())
        sys.exit(77)
    sh("ip", "netns", "del", probe)

    import torch
    from gpt import GPT, GPTConfig, export
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0, tied=True))
    export(copy.deepcopy(gpt), J("gpt.onnx"), 4, 16)
    rng = np.random.default_rng(0)
    rng.integers(0, 64, 16 * 48 + 1).astype("<u2").tofile(J("tokens.bin"))
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    mlp = os.path.join(ROOT, "examples", "mlp.onnx")
    gpt_build = [J("gpt.onnx"), "--loss", "cross_entropy:logits,labels", "--wrap", "size:9000"]
    mlp_build = [mlp, "--loss", "mse:y,target", "--wrap", "size:600"]
    gpt_data = ["--tokens", J("tokens.bin"), "--lr", "1e-3"]
    mlp_data = ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--lr", "1e-3"]
    train = ["--steps", str(STEPS), "--clip-grad-norm", "1e9"]

    def build(tag, model, world, extra=()):
        exe = J(tag)
        run([fsdpc] + model[:1] + ["-o", exe, "--target", "cpu", "--dim", "batch=%d" % (12 // world)] + model[1:]
            + list(extra))
        return exe

    def params_bytes(exe_model):
        return sum(v.nbytes for v in onnx_weights(exe_model).values() if v.dtype == np.float32)

    single = ["mpirun", "--oversubscribe", "-np"]
    with Hosts(3, work) as hosts:
        cases = [("gpt_full", gpt_build, gpt_data, [2, 2, 0], []),
                 ("gpt_hybrid", gpt_build, gpt_data, [2, 2, 0], ["--shard", "hybrid:2"]),
                 ("mlp_3hosts", mlp_build, mlp_data, [1, 1, 1], [])]
        for tag, model, data, per_host, extra in cases:
            world = sum(per_host)
            nhosts = sum(1 for k in per_host if k)
            exe = build(tag, model, world, extra)
            argv = lambda t: [exe] + data + train + ["--metrics", J(t + ".jsonl"), "--export-onnx", J(t + ".onnx")]
            run(single + [str(world)] + argv(tag + "_one"))
            before = [hosts.rx_bytes(i) for i in range(nhosts)]
            p = run(hosts.mpirun(per_host, [argv(tag)]), timeout=300)
            got = [hosts.rx_bytes(i) - b for i, b in enumerate(before)]
            want = "ranks: %d on %d hosts" % (world, nhosts)
            check(want in p.stdout, "%s: the start lines lack %r:\n%s" % (tag, want, p.stdout[:2000]))
            a, b = rows(J(tag + ".jsonl")), rows(J(tag + "_one.jsonl"))
            check(len(a) == STEPS and [(r["loss"], r["grad_norm"]) for r in a] == [(r["loss"], r["grad_norm"])
                                                                                  for r in b],
                  "%s: losses across hosts %s, on one host %s" % (tag, [r["loss"] for r in a], [r["loss"] for r in b]))
            wa, wb = onnx_weights(J(tag + ".onnx")), onnx_weights(J(tag + "_one.onnx"))
            for k in wb:
                check(np.array_equal(wa[k], wb[k]), "%s: weight %s differs from the one-host run's by %.3g"
                      % (tag, k, rel_err(wa[k], wb[k])))
            # every rank gathers each unit before its forward: the shards held on the other hosts come in over
            # the host's link at least once per step (hybrid:2 gathers inside the host: across the hosts goes the
            # gradient all-reduce of each half, at least a half of the model into each host per step)
            P = params_bytes(J(tag + ".onnx"))
            for i in range(nhosts):
                need = STEPS * (P / 2 if "hybrid" in tag else P * (world - per_host[i]) / world)
                check(got[i] >= need, "%s: host %d's link received %d B, below the %d B its ranks must get from "
                      "the other hosts" % (tag, i, got[i], need))
            print("%-11s %d hosts %s: %d steps bit-identical to mpirun -np %d on one host; link rx %s B "
                  "(parameters %d B)" % (tag, nhosts, per_host[:nhosts], STEPS, world,
                                         "/".join(str(g) for g in got), P))

        # the watchdog across hosts: rank 0 blocked in open() of a FIFO, the others at start-up
        exe = J("gpt_full")
        os.mkfifo(J("metrics.fifo"))
        env = dict(os.environ, FSDPC_STEP_TIMEOUT="3")
        t0 = time.time()
        p = run(hosts.mpirun([1, 3], env=env, apps=[["-np", "1", exe] + gpt_data + train
                                      + ["--metrics", J("metrics.fifo")],
                                      ["-np", "3", exe] + gpt_data + train]),
                check=False, env=env, timeout=120)
        took = time.time() - t0
        pat = (r"error: rank [123]: start-up: the control plane's \w+ made no progress for 3 s "
               r"\(FSDPC_STEP_TIMEOUT\): did not arrive: rank 0 is at start-up, outside any collective")
        check(p.returncode != 0 and re.search(pat, p.stderr), "rank 0 blocked: exit %d after %.1f s, stderr lacks "
              "%r:\n%s" % (p.returncode, took, pat, p.stderr[-3000:]))
        print("watchdog    ranks on host 1 name rank 0 on host 0 (asked over UDP): exit %d after %.1f s"
              % (p.returncode, took))

        # the cuda target's control plane across the hosts (rendezvous through Open MPI, then its own TCP)
        ref = build("mlp_w4", mlp_build, 4)
        run(single + ["4"] + [ref] + mlp_data + train + ["--metrics", J("tcp_ref.jsonl"), "--export-onnx",
                                                         J("tcp_ref.onnx")])
        exe = build("mlp_tcp", mlp_build, 4, ["--cc", cc_tcp])
        p = run(hosts.mpirun([2, 2], [[exe] + mlp_data + train + ["--metrics", J("tcp.jsonl"), "--export-onnx",
                                                                  J("tcp.onnx")]]), timeout=300)
        check("ranks: 4 on 2 hosts" in p.stdout, "tcp control plane: the output lacks 'ranks: 4 on 2 hosts':\n%s"
              % p.stdout[:2000])
        a, b = rows(J("tcp.jsonl")), rows(J("tcp_ref.jsonl"))
        check(len(a) == STEPS and all(abs(x["loss"] - y["loss"]) <= 1e-6 * abs(y["loss"]) for x, y in zip(a, b)),
              "tcp control plane: losses %s, MPI runtime's %s" % ([r["loss"] for r in a], [r["loss"] for r in b]))
        wa, wb = onnx_weights(J("tcp.onnx")), onnx_weights(J("tcp_ref.onnx"))
        for k in wb:
            e = rel_err(wa[k], wb[k])
            check(e <= 1e-6, "tcp control plane: weight %s differs from the MPI runtime's by %.3g" % (k, e))
        print("ctl_tcp     2 hosts [2, 2]: %d steps = the MPI runtime's world-4 run within 1e-6" % STEPS)

        # host 1 cut off mid-run, with 2 ranks on host 0 and 1 on host 1 (host 2, which runs none, is a stranger)
        exe, long_run = J("gpt_full"), ["--steps", "100000000", "--log-every", "100000000"]
        name = os.path.basename(exe)

        def side_channel():
            """the watchdog's sockets are bound where the peers are, and a stranger gets no answer"""
            mine = [udp_sockets(hosts, i, name) for i in (0, 1)]
            ips = [sorted(a.rsplit(":", 1)[0] for a in m) for m in mine]
            check(ips == [["10.250.0.1", "10.250.0.1", "127.0.0.1", "127.0.0.1"], ["10.250.0.2"]],
                  "the watchdog's UDP sockets are bound at %s on host 0 and %s on host 1: expected 127.0.0.1 and "
                  "the host's own address for each rank on host 0, the address alone on host 1" % tuple(mine))
            net = [a for m in mine for a in m if not a.startswith("127.")]
            for i, targets in ((2, net), (0, mine[0])):  # another host; a process on a peer's host
                n = sh(*hosts.on(i, ["/usr/bin/python3", "-c", PROBE, "3"] + targets)).stdout.strip()
                check(n == "0", "host %d asked the watchdog at %s with a wrong token and got %s answers"
                      % (i, targets, n))

        # (a) fsdpc's watchdog ends it: every rank exits within FSDPC_STEP_TIMEOUT + 1.5 s, rank 0's MPI_Abort
        # makes mpirun order every daemon to kill its ranks and wait for their answers; host 1's never comes, so
        # mpirun (and host 1's daemon, waiting to tell it) stay until the kernel gives their TCP connection up:
        # net.ipv4.tcp_retries2 retransmissions, 15 by default (~15 min), 5 here (~13 s)
        for ns in hosts.ns:
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_retries2=5")
        rc, took, err = run_cut(hosts, work, [2, 1], [exe] + gpt_data + long_run, {"FSDPC_STEP_TIMEOUT": "3"},
                                before=side_channel)
        pat = (r"error: rank [01]: (start-up|step \d+): [^\n]* made no progress for 3 s \(FSDPC_STEP_TIMEOUT\): "
               r"did not arrive: [^\n]*rank 2 not responding")
        check(rc != 0 and re.search(pat, err), "host 1 cut off: mpirun exited %d, its stderr lacks %r:\n%s"
              % (rc, pat, err[-3000:]))
        print("partition   host 1 cut off, FSDPC_STEP_TIMEOUT=3, tcp_retries2=5: ranks, mpirun and daemons gone "
              "%.1f s later, exit %d: %s" % (took, rc, re.search(pat, err).group(0)[:80]))
        print("side chan.  the watchdog's sockets on 127.0.0.1 and the host's address; a stranger host and a "
              "process on host 0 got no answer")

        # (b) Open MPI notices first: with keepalive probes on its daemons' connections, idle during the steps
        # (here 2 s + 3 x 1 s, below FSDPC_STEP_TIMEOUT's default 600 s), mpirun loses host 1's daemon and ends
        # the job on both sides, whatever tcp_retries2 is
        for ns in hosts.ns:
            sh("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.tcp_retries2=15")
        keep = ["--mca", "oob_tcp_keepalive_time", "2", "--mca", "oob_tcp_keepalive_intvl", "1",
                "--mca", "oob_tcp_keepalive_probes", "3"]
        rc, took, err = run_cut(hosts, work, [1, 1], [exe] + gpt_data + long_run, {}, opts=keep)
        want = "ORTE has lost communication with a remote daemon"
        check(rc != 0 and want in err and "fsdpc-node1" in err, "host 1 cut off under keepalive: mpirun exited "
              "%d, its stderr lacks %r naming fsdpc-node1:\n%s" % (rc, want, err[-3000:]))
        print("partition   host 1 cut off, oob_tcp_keepalive 2+3x1 s: mpirun lost its daemon; the whole job gone "
              "%.1f s later, exit %d" % (took, rc))
    print("multihost: OK")


if __name__ == "__main__":
    main()
