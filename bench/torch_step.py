"""One PyTorch side of the step benchmarks (bench/gpt_cpu.py, bench/gpt_bf16.py), in its own process (any torch:
Debian's 1.13 or PyPI's 2.x); one rank of several when the driver starts it so.

    PYTHON bench/torch_step.py DIR MODE THREADS STEPS [PRECISION]

DIR holds cfg.json (the model's name: bench/models.py's, a GPT, a BERT-style encoder or a ResNet), weights.npz
(its state_dict, the fsdpc side's initial weights), idx.npy and lab.npy (one batch, B rows: the input and labels).  MODE: eager, compile (torch.compile, torch >= 2), ddp or fsdp2 (torch >= 2:
DistributedDataParallel, or `fully_shard` on each block and then the model, over gloo; the driver starts
WORLD_SIZE processes with RANK, MASTER_ADDR and MASTER_PORT set, and rank r trains on the r-th of WORLD_SIZE
contiguous slices of the batch, as fsdpc's ranks read it).  PRECISION: fp32 (default) or bf16 — the forward and
the loss under torch.autocast("cpu", dtype=torch.bfloat16), the backward and AdamW outside it, as PyTorch's
recipe has it (parameters, gradients and optimizer state stay float32).  The thread counts are set before torch
loads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, torch.set_num_threads).  A step = zero_grad +
forward + cross-entropy + backward + AdamW (lr 1e-4, PyTorch's defaults otherwise).  Prints one JSON line: per
step (the first, a warm-up and for compile the compilation, included) its wall time in ms, this process's CPU
time in seconds (all its threads: CLOCK_PROCESS_CPUTIME_ID) and its loss (this rank's slice); the peak RSS (VmHWM);
and whether this CPU has AVX512-BF16 as torch sees it (torch >= 2).  With BENCH_STEP_FILE set, rank 0 appends a
line {"step": N} to that file as each step ends (bench/contention.py starts its late competitor on the first).
"""
import contextlib
import json
import os
import resource
import sys
import time

d, mode, threads, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
precision = sys.argv[5] if len(sys.argv) > 5 else "fp32"
for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[k] = str(threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

torch.set_num_threads(threads)
model = models.build(json.load(open(os.path.join(d, "cfg.json")))["model"])
w = np.load(os.path.join(d, "weights.npz"))
model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files}, strict=False)
idx = torch.from_numpy(np.load(os.path.join(d, "idx.npy")))
lab = torch.from_numpy(np.load(os.path.join(d, "lab.npy")))
if mode in ("ddp", "fsdp2"):
    import torch.distributed as dist
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    b = idx.shape[0] // world
    idx, lab = idx[rank * b:(rank + 1) * b], lab[rank * b:(rank + 1) * b]
    if mode == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for block in model.transformer.h:
            fully_shard(block)
        fully_shard(model)
    else:
        model = torch.nn.parallel.DistributedDataParallel(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
fwd = torch.compile(model) if mode == "compile" else model


def autocast():
    """the context the forward and loss run in: autocast to bfloat16 for PRECISION bf16"""
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    if precision != "fp32":
        sys.exit("torch_step.py: PRECISION %s: fp32 or bf16" % precision)
    return contextlib.nullcontext()


times, cpu, losses = [], [], []
for _ in range(steps + 1):
    t, c = time.perf_counter(), time.process_time()
    opt.zero_grad(set_to_none=True)
    with autocast():
        logits = fwd(idx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), lab.reshape(-1))
    loss.backward()
    opt.step()
    losses.append(loss.item())
    times.append((time.perf_counter() - t) * 1e3)
    cpu.append(time.process_time() - c)
    if os.environ.get("BENCH_STEP_FILE") and os.environ.get("RANK", "0") == "0":
        with open(os.environ["BENCH_STEP_FILE"], "a") as f:  # bench/contention.py's late competitor waits on it
            f.write('{"step": %d}\n' % len(times))
# VmHWM: ru_maxrss survives exec, so it would include the driver's peak
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")]
bf16 = getattr(getattr(torch, "cpu", None), "_is_avx512_bf16_supported", None)
print(json.dumps({"torch": torch.__version__, "times_ms": times, "cpu_s": cpu, "losses": losses, "loss": losses[-1],
                  "avx512_bf16": bf16() if bf16 else None,
                  "peak_rss_bytes": hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
if mode in ("ddp", "fsdp2"):
    dist.destroy_process_group()
