"""The work folder of one model for the step benchmarks (bench/gpt_cpu.py, bench/gpt_bf16.py, bench/contention.py,
bench/matrix.py), and the runs of each side on it, every side a process of its own with its thread counts set
explicitly.

prepare() writes the folder of a GPT (examples/gpt.py: vocab 256, one head per 64 channels, seed 0), prepare_model()
that of any of bench/models.py's models (the GPT, a BERT-style encoder, ResNet-18/50): its name (cfg.json),
parameter names (params.json), initial weights (weights.npz: the state_dict the PyTorch sides load, so every side
starts from the same numbers whichever torch runs it), one batch of B rows (idx.npy, the input whatever its name in
the model, and lab.npy: every step of every side trains on it) and the ONNX export (gpt.onnx whichever the model,
training mode, the batch axis symbolic).  It runs under the driver's torch (Debian's 1.13, or PyTorch 2.15 for
bench/matrix.py: the TorchScript exporter on both).  The driver runs one side at a time.  build()
compiles that ONNX file with fsdpc (--target cpu, the cross-entropy loss, --dim batch=N, extra flags) and returns
fsdpc's notes; run_fsdpc() runs the executable (one process, or mpirun -np R: each rank reads its contiguous slice
of the batch, the printed loss the mean over the global batch) and run_torch() runs bench/torch_step.py under a
given python (one process, or R processes over gloo, their losses averaged as fsdpc's are).  Both return one dict per run:
  times_ms   wall time of each step (the slowest rank's), the first a warm-up;
  losses     the loss of each step over the global batch;
  cpu_s      (PyTorch) the CPU time of each step, all its processes and threads (CLOCK_PROCESS_CPUTIME_ID around each
             step, summed over ranks);
  cpu_step_s (fsdpc) the CPU time per step of every thread of its processes (mpirun's own not counted) between the
             end of the first step and the end of the last (/proc/PID/task/TID/schedstat, read as the metrics file
             shows each step's line: the warm-up step and the start-up are out, as PyTorch's; None when the steps
             ran too fast to be sampled);
  cpu_run_s  (fsdpc) the CPU time of the whole run, start-up and every step included (getrusage of the children);
  peak_rss   the largest process's peak resident memory (VmHWM: GNU time's %M for fsdpc, /proc/self/status for
             PyTorch);
  notes      the 'note:' lines the side printed (fsdpc's executable says where its bf16 GEMMs run widened).
"""
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import models  # noqa: E402

VOCAB = models.VOCAB


def parse_sizes(text):
    """"d/L/T/B,..." -> [(d, L, T, B), ...]"""
    return [tuple(int(v) for v in s.split("/")) for s in text.split(",") if s]


def thread_env(threads, **extra):
    """os.environ with every thread count this benchmark's libraries read set to threads, and extra"""
    env = dict(os.environ, **extra)
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    return env


def prepare(work, d, L, T, B):
    """writes the folder work (made here) for the d/L/T/B GPT, as the module's essay says; its parameter count"""
    return prepare_model(work, "gpt:%d/%d/%d/%d" % (d, L, T, B))


def prepare_model(work, name):
    """writes the folder work (made here) for bench/models.py's model name (kind:shape), as the module's essay
    says; its parameter count"""
    import numpy as np
    import warnings
    import models
    os.makedirs(work)
    model = models.build(name)
    json.dump({"model": name}, open(os.path.join(work, "cfg.json"), "w"))
    json.dump([n for n, _ in model.named_parameters()], open(os.path.join(work, "params.json"), "w"))
    np.savez(os.path.join(work, "weights.npz"), **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    x, y = models.batch_data(name)
    np.save(os.path.join(work, "idx.npy"), x)
    np.save(os.path.join(work, "lab.npy"), y)
    with warnings.catch_warnings():  # ResNet: "Removing mutation from node aten::add_ on ... num_batches_tracked"
        warnings.simplefilter("ignore", UserWarning)
        models.export(model, name, os.path.join(work, "gpt.onnx"))
    return sum(p.numel() for p in model.parameters())


def notes(text):
    """the 'note:' lines of a side's stderr"""
    return [l.strip() for l in text.splitlines() if "note:" in l]


def build(fsdpc, work, name, batch, flags=()):
    """compiles work/gpt.onnx into work/name for a batch of batch rows per rank with fsdpc's extra flags; fsdpc's
    notes (a list of lines)"""
    p = subprocess.run([fsdpc, os.path.join(work, "gpt.onnx"), "-o", os.path.join(work, name), "--target", "cpu",
                        "--loss", "cross_entropy:logits,labels", "--dim", "batch=%d" % batch] + list(flags),
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("bench: fsdpc %s failed:\n%s" % (" ".join(flags), p.stderr[-3000:]))
    return notes(p.stderr)


class competitor:
    """with competitor(core): one busy process (`while :; do :; done`) pinned to core (None: none) for the block's
    duration, killed on the way out"""

    def __init__(self, core, after=None):
        """after: a metrics file; the competitor starts once it holds a step line (arriving after start-up)"""
        self.core, self.after, self.p, self.stop, self.t = core, after, None, False, None

    def start(self):
        self.p = subprocess.Popen(["taskset", "-c", str(self.core), "sh", "-c", "while :; do :; done"])

    def wait_then_start(self):
        while not self.stop:
            if os.path.exists(self.after) and '"step"' in open(self.after).read():
                return self.start()
            time.sleep(0.005)

    def __enter__(self):
        if self.core is not None and self.after is None:
            self.start()
        elif self.core is not None:
            import threading
            self.t = threading.Thread(target=self.wait_then_start)
            self.t.start()
        return self

    def __exit__(self, *exc):
        self.stop = True
        if self.t:
            self.t.join()
        if self.p:
            self.p.kill()
            self.p.wait()


def descendants(root, name):
    """the pids of root's descendant processes whose command is name (as /proc/PID/stat spells it: 15 characters)"""
    kids = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            st = open("/proc/%s/stat" % pid).read()
        except OSError:  # gone meanwhile
            continue
        comm, ppid = st[st.index("(") + 1:st.rindex(")")], int(st[st.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append((int(pid), comm))
    out, todo = [], [root]
    while todo:
        for pid, comm in kids.get(todo.pop(), []):
            todo.append(pid)
            if comm == os.path.basename(name)[:15]:
                out.append(pid)
    return out


def threads_cpu_s(pids):
    """the CPU seconds every thread of pids has run so far (/proc/PID/task/TID/schedstat, in ns); None when one of
    them is gone"""
    total = 0
    try:
        for pid in pids:
            for tid in os.listdir("/proc/%d/task" % pid):
                total += int(open("/proc/%d/task/%s/schedstat" % (pid, tid)).read().split()[0])
    except OSError:
        return None
    return total * 1e-9


def sample_steps(p, m, name):
    """while p runs: after each new step line of the metrics file m, (steps so far, CPU seconds of every thread of
    the processes named name under p); the file is polled every 2 ms, the processes read only when it grows"""
    samples, size, pids = [], 0, None
    while p.poll() is None:
        time.sleep(0.002)
        if not os.path.exists(m) or os.stat(m).st_size == size:
            continue
        size = os.stat(m).st_size
        n = sum('"step"' in l for l in open(m))
        pids = pids or descendants(p.pid, name)
        cpu = threads_cpu_s(pids) if pids else None
        if n and cpu is not None and (not samples or n > samples[-1][0]):
            samples.append((n, cpu))
    return samples


def run_fsdpc(work, name, steps, threads, ranks=1, prefix=(), env=None):
    """runs work/name for steps steps with threads threads per process, as one process or ranks ranks under
    mpirun, each process under GNU time, the whole command after prefix (e.g. taskset -c 0,1) with env's
    variables added; the run's dict (the module's essay)"""
    m, timing = os.path.join(work, name + ".jsonl"), os.path.join(work, name + ".time.")
    for f in [m] + [timing + str(r) for r in range(ranks)]:
        if os.path.exists(f):
            os.unlink(f)
    extra = env or {}
    env = thread_env(threads, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **extra)
    inp = models.input_name(json.load(open(os.path.join(work, "cfg.json")))["model"])
    exe = [os.path.join(work, name), "--data", inp + "=" + os.path.join(work, "idx.npy"), "--data",
           "labels=" + os.path.join(work, "lab.npy"), "--steps", str(steps), "--lr", "1e-4", "--metrics", m, "--quiet"]
    timed = 'exec /usr/bin/time -f "%M" -o "$0${OMPI_COMM_WORLD_RANK:-0}" "$@"'  # a file per rank
    cmd = ["sh", "-c", timed, timing] + exe
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + \
            sum((["-x", "%s=%d" % (k, threads)] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")), []) + \
            sum((["-x", k] for k in extra), []) + cmd
    cmd = list(prefix) + cmd
    with tempfile.TemporaryFile("w+") as err:
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        samples = sample_steps(p, m, exe[0])
        err.seek(0)
        rc = p.wait()
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        if rc != 0:
            raise SystemExit("bench: %s failed:\n%s" % (" ".join(cmd), err.read()[-3000:]))
        text = err.read()
    rows = [json.loads(l) for l in open(m) if '"step"' in l]
    (n0, c0), (n1, c1) = (samples[0], samples[-1]) if samples else ((0, 0), (0, 0))
    rss = max(int(open(timing + str(r)).read().split()[-1]) * 1024 for r in range(ranks))
    return dict(times_ms=[r["time_ms"] for r in rows], losses=[r["loss"] for r in rows], peak_rss=rss,
                cpu_step_s=(c1 - c0) / (n1 - n0) if n1 > n0 else None, notes=notes(text),
                cpu_run_s=r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)


def run_torch(py, work, mode, threads, steps, precision="fp32", ranks=1, port=29517, prefix=()):
    """bench/torch_step.py under py for steps steps (after its warm-up) in mode and precision, with threads
    threads per process: one process, or ranks ranks over gloo (mode ddp or fsdp2), each after prefix; the run's
    dict (the module's essay)"""
    cmd = list(prefix) + [py, os.path.join(HERE, "torch_step.py"), work, mode, str(threads), str(steps), precision]
    # Inductor's compile workers would take the cores the timed steps share (the compilation is not timed)
    env = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), WORLD_SIZE=str(ranks), TORCHINDUCTOR_COMPILE_THREADS="1")
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=thread_env(threads, RANK=str(r), **env)) for r in range(ranks)]
    outs = [p.communicate() for p in procs]
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise SystemExit("bench: %s failed:\n%s" % (" ".join(cmd), err[-3000:]))
    rs = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    return dict(times_ms=[max(t) for t in zip(*(r["times_ms"] for r in rs))],
                losses=[sum(v) / ranks for v in zip(*(r["losses"] for r in rs))],
                cpu_s=[sum(v) for v in zip(*(r["cpu_s"] for r in rs))], peak_rss=max(r["peak_rss_bytes"] for r in rs),
                notes=notes(outs[0][1]), avx512_bf16=rs[0].get("avx512_bf16"), torch=rs[0]["torch"])
