"""The work folder of one GPT for the step benchmarks (bench/gpt_cpu.py, bench/gpt_bf16.py), and the runs of each
side on it, every side a process of its own with its thread counts set explicitly.

prepare() writes the folder: the GPT of examples/gpt.py (vocab 256, one head per 64 channels, seed 0), its config
(cfg.json), parameter names (params.json), initial weights (weights.npz: the state_dict the PyTorch sides load, so
every side starts from the same numbers whichever torch runs it), one batch of B rows (idx.npy, lab.npy: every
step of every side trains on it) and the ONNX export (gpt.onnx, training mode, the batch axis symbolic).  It runs
under the driver's torch (Debian's 1.13: its TorchScript exporter).  The driver runs one side at a time.  build()
compiles that ONNX file with fsdpc (--target cpu, the cross-entropy loss, --dim batch=N, extra flags) and returns
fsdpc's notes; run_fsdpc() runs the executable (one process, or mpirun -np R: each rank reads its contiguous slice
of the batch, the printed loss the mean over the global batch) and run_torch() runs bench/torch_step.py under a
given python (one process, or R processes over gloo, their losses averaged as fsdpc's are).  Both return one dict per run:
  times_ms   wall time of each step (the slowest rank's), the first a warm-up;
  losses     the loss of each step over the global batch;
  cpu_s      CPU time of all the run's processes (user + system, every thread): fsdpc's for the whole run (the
             driver's RUSAGE_CHILDREN before and after, mpirun's own share included; the caller subtracts a shorter
             run for the start-up), PyTorch's per step (CLOCK_PROCESS_CPUTIME_ID around each step, summed over
             ranks);
  peak_rss   the largest process's peak resident memory (VmHWM: GNU time's %M for fsdpc, /proc/self/status for
             PyTorch);
  notes      the 'note:' lines the side printed (fsdpc's executable says where its bf16 GEMMs run widened).
"""
import json
import os
import resource
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = 256


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
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    from gpt import GPT, GPTConfig, export
    os.makedirs(work)
    torch.manual_seed(0)
    cfg = dict(vocab_size=VOCAB, n_layer=L, n_head=max(1, d // 64), n_embd=d, block_size=T)
    model = GPT(GPTConfig(**cfg))
    json.dump(cfg, open(os.path.join(work, "cfg.json"), "w"))
    json.dump([n for n, _ in model.named_parameters()], open(os.path.join(work, "params.json"), "w"))
    np.savez(os.path.join(work, "weights.npz"), **{k: v.detach().numpy() for k, v in model.state_dict().items()})
    np.save(os.path.join(work, "idx.npy"), torch.randint(0, VOCAB, (B, T)).numpy())
    np.save(os.path.join(work, "lab.npy"), torch.randint(0, VOCAB, (B, T)).numpy())
    export(model, os.path.join(work, "gpt.onnx"), B=B, T=T)
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


def run_fsdpc(work, name, steps, threads, ranks=1):
    """runs work/name for steps steps with threads threads per process, as one process or ranks ranks under
    mpirun, each process under GNU time; the run's dict (the module's essay)"""
    m, timing = os.path.join(work, name + ".jsonl"), os.path.join(work, name + ".time.")
    for r in range(ranks):
        if os.path.exists(timing + str(r)):
            os.unlink(timing + str(r))
    env = thread_env(threads, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    exe = [os.path.join(work, name), "--data", "input_ids=" + os.path.join(work, "idx.npy"), "--data",
           "labels=" + os.path.join(work, "lab.npy"), "--steps", str(steps), "--lr", "1e-4", "--metrics", m, "--quiet"]
    timed = 'exec /usr/bin/time -f "%M" -o "$0${OMPI_COMM_WORLD_RANK:-0}" "$@"'  # a file per rank
    cmd = ["sh", "-c", timed, timing] + exe
    if ranks > 1:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(ranks)] + \
            sum((["-x", "%s=%d" % (k, threads)] for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")), []) + cmd
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit("bench: %s failed:\n%s" % (" ".join(cmd), p.stderr[-3000:]))
    rows = [json.loads(l) for l in open(m) if '"step"' in l]
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    rss = max(int(open(timing + str(r)).read().split()[-1]) * 1024 for r in range(ranks))
    return dict(times_ms=[r["time_ms"] for r in rows], losses=[r["loss"] for r in rows], cpu_s=cpu, peak_rss=rss,
                notes=notes(p.stderr))


def run_torch(py, work, mode, threads, steps, precision="fp32", ranks=1, port=29517):
    """bench/torch_step.py under py for steps steps (after its warm-up) in mode and precision, with threads
    threads per process: one process, or ranks ranks over gloo (mode ddp or fsdp2); the run's dict (the module's
    essay)"""
    cmd = [py, os.path.join(HERE, "torch_step.py"), work, mode, str(threads), str(steps), precision]
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
