"""fsdpc's CPU training step against PyTorch's on the same GPT, single process.

    bench/gpt_cpu.py [--threads 2] [--steps 5] [--fsdpc build/fsdpc]

Run with Debian's /usr/bin/python3 (torch 1.13).  Both sides get the same
thread count: OPENBLAS_NUM_THREADS and OMP_NUM_THREADS are set explicitly
(Debian's torch calls OpenBLAS, which ignores torch.set_num_threads alone).
A step = forward + cross-entropy + backward + AdamW.  Prints a table of
median step times, the ratio fsdpc/PyTorch, and GFLOP/s against this
machine's sgemm peak at the same thread count (measured here, 2048^3).
Training FLOPs per token: 6 N (N = parameters) + 12 L T d (attention).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--fsdpc", default=os.path.join(os.path.dirname(__file__), "..", "build", "fsdpc"))
args = ap.parse_args()
for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
    os.environ[k] = str(args.threads)  # before numpy/torch load OpenBLAS

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, GPTConfig, export  # noqa: E402

torch.set_num_threads(args.threads)
SIZES = [(128, 4, 128, 8), (256, 6, 256, 8), (512, 8, 256, 8)]  # d, L, T, B
VOCAB = 256


def sgemm_peak():
    a = np.random.rand(2048, 2048).astype(np.float32)
    a @ a
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * 2048 ** 3 / best / 1e9


def torch_step_ms(model, idx, labels):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for _ in range(args.steps + 1):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        opt.step()
        times.append((time.perf_counter() - t) * 1e3)
    return float(np.median(times[1:]))


def fsdpc_step_ms(model, d, B, T, idx, labels, work):
    path = os.path.join(work, "gpt.onnx")
    export(model, path, B=B, T=T)
    exe = os.path.join(work, "train")
    subprocess.run([args.fsdpc, path, "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels",
                    "--dim", "batch=%d" % B], check=True)
    np.save(os.path.join(work, "idx.npy"), idx.numpy())
    np.save(os.path.join(work, "lab.npy"), labels.numpy())
    m = os.path.join(work, "m.jsonl")
    subprocess.run([exe, "--data", "input_ids=" + os.path.join(work, "idx.npy"), "--data",
                    "labels=" + os.path.join(work, "lab.npy"), "--steps", str(args.steps + 1), "--lr", "1e-4",
                    "--metrics", m, "--quiet"], check=True)
    import json
    times = [json.loads(l)["time_ms"] for l in open(m) if '"step"' in l]
    return float(np.median(times[1:]))


def main():
    peak = sgemm_peak()
    print("threads %d, sgemm 2048^3 peak %.1f GFLOP/s, %d timed steps after 1 warm-up" % (args.threads, peak, args.steps))
    print("%-14s %10s %12s %12s %8s %10s %10s" % ("d/L/T/B", "params", "pytorch ms", "fsdpc ms", "ratio",
                                                   "fsdpc GF/s", "% peak"))
    for d, L, T, B in SIZES:
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=VOCAB, n_layer=L, n_head=max(1, d // 64), n_embd=d, block_size=T)
        model = GPT(cfg)
        n = sum(p.numel() for p in model.parameters())
        idx = torch.randint(0, VOCAB, (B, T))
        labels = torch.randint(0, VOCAB, (B, T))
        flops = (6 * n + 12 * L * T * d) * B * T
        with tempfile.TemporaryDirectory() as work:
            f_ms = fsdpc_step_ms(model, d, B, T, idx, labels, work)
        t_ms = torch_step_ms(model, idx, labels)
        gfs = flops / (f_ms / 1e3) / 1e9
        print("%-14s %10d %12.1f %12.1f %8.2f %10.1f %9.1f%%" % ("%d/%d/%d/%d" % (d, L, T, B), n, t_ms, f_ms,
                                                                 f_ms / t_ms, gfs, 100 * gfs / peak))


if __name__ == "__main__":
    main()
