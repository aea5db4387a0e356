"""One PyTorch side of bench/gpt_cpu.py, in its own process (any torch: Debian's 1.13 or PyPI's 2.x).

    PYTHON bench/torch_step.py DIR MODE THREADS STEPS

DIR holds cfg.json (the GPT's config), weights.npz (its state_dict, the fsdpc side's initial weights),
idx.npy and lab.npy (one batch).  MODE: eager, or compile (torch.compile, torch >= 2).  The thread counts are
set before torch loads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, torch.set_num_threads).  A step =
zero_grad + forward + cross-entropy + backward + AdamW (lr 1e-4, PyTorch's defaults otherwise).  Prints one JSON
line: the step times in ms (the first, a warm-up and for compile the compilation, included) and the peak RSS.
"""
import json
import os
import resource
import sys
import time

d, mode, threads, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[k] = str(threads)

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
from gpt import GPT, GPTConfig  # noqa: E402

torch.set_num_threads(threads)
cfg = GPTConfig(**json.load(open(os.path.join(d, "cfg.json"))))
model = GPT(cfg)
w = np.load(os.path.join(d, "weights.npz"))
model.load_state_dict({k: torch.from_numpy(w[k]) for k in w.files}, strict=False)
idx = torch.from_numpy(np.load(os.path.join(d, "idx.npy")))
lab = torch.from_numpy(np.load(os.path.join(d, "lab.npy")))
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
fwd = torch.compile(model) if mode == "compile" else model
times = []
for _ in range(steps + 1):
    t = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    logits = fwd(idx)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), lab.reshape(-1))
    loss.backward()
    opt.step()
    times.append((time.perf_counter() - t) * 1e3)
# VmHWM: ru_maxrss survives exec, so it would include the driver's peak
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")]
print(json.dumps({"torch": torch.__version__, "times_ms": times, "loss": float(loss),
                  "peak_rss_bytes": hwm[0] if hwm else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
