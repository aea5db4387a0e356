"""--lr-schedule constant, cosine, linear and wsd against PyTorch's own schedulers.

usage: schedules.py FSDPC WORKDIR

fsdpc's learning rate of step s (1-based, in --metrics) must equal, within 1e-9 relative, the lr PyTorch's
optimizer holds for step s (after s - 1 scheduler steps) under the composition of torch.optim.lr_scheduler
classes a user would write (Debian's torch 1.13):
  warmup W (all):  LinearLR(1/W, 1, W - 1), the first scheduler of a SequentialLR switching at W - 1
  constant:        the warmup alone (it holds 1 after W - 1)
  cosine:          then CosineAnnealingLR(T_max = D - W, eta_min = min_lr)
  linear:          then LinearLR(1, min_lr / lr, D - W)
  wsd:             then ConstantLR(1) until D - K - 1, then LinearLR(1, min_lr / lr, K)
with lr 0.01, W = 3, D = --steps = 20, min_lr 0.001 (cosine, linear, wsd), K = 6 (wsd) and K = ceil((D-W)/5).
"""
import json
import os
import sys
import warnings

import numpy as np
import torch

from common import check, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LR, W, D, MIN = 0.01, 3, 20, 0.001


def torch_lrs(kind, k=None):
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=LR)
    S = torch.optim.lr_scheduler
    warm = S.LinearLR(opt, start_factor=1 / W, end_factor=1.0, total_iters=W - 1)
    if kind == "constant":
        sched = warm
    elif kind == "cosine":
        sched = S.SequentialLR(opt, [warm, S.CosineAnnealingLR(opt, T_max=D - W, eta_min=MIN)], milestones=[W - 1])
    elif kind == "linear":
        sched = S.SequentialLR(opt, [warm, S.LinearLR(opt, 1.0, MIN / LR, total_iters=D - W)], milestones=[W - 1])
    else:
        sched = S.SequentialLR(opt, [warm, S.ConstantLR(opt, factor=1.0, total_iters=1),
                                     S.LinearLR(opt, 1.0, MIN / LR, total_iters=k)], milestones=[W - 1, D - k - 1])
    out = []
    for _ in range(D):
        out.append(opt.param_groups[0]["lr"])
        opt.step()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sched.step()
    return out


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    exe = os.path.join(work, "mlp")
    run([fsdpc, os.path.join(ROOT, "examples", "mlp.onnx"), "-o", exe, "--target", "cpu", "--loss", "mse:y,t",
         "--optimizer", "sgd", "--dim", "batch=4"])
    rng = np.random.default_rng(0)
    np.save(exe + ".x.npy", rng.standard_normal((8, 16)).astype(np.float32))
    np.save(exe + ".t.npy", rng.standard_normal((8, 1)).astype(np.float32))
    for kind, extra, k in (("constant", [], None), ("cosine", ["--min-lr", str(MIN)], None),
                           ("linear", ["--min-lr", str(MIN)], None),
                           ("wsd", ["--min-lr", str(MIN), "--wsd-decay-steps", "6"], 6),
                           ("wsd", ["--min-lr", str(MIN)], -(-(D - W) // 5))):
        metrics = "%s.%s%s.jsonl" % (exe, kind, k or "")
        run([exe, "--data", "x=%s.x.npy" % exe, "--data", "t=%s.t.npy" % exe, "--steps", str(D), "--lr", str(LR),
             "--lr-schedule", kind, "--warmup-steps", str(W), "--quiet", "--metrics", metrics] + extra)
        got = [json.loads(l)["lr"] for l in open(metrics) if '"step"' in l]
        want = torch_lrs(kind, k)
        bad = [(s + 1, g, w) for s, (g, w) in enumerate(zip(got, want)) if abs(g - w) > 1e-9 * w]
        check(len(got) == D and not bad, "%s K=%s: step, fsdpc lr, torch lr: %s" % (kind, k, bad[:4]))
        print("ok %-8s %-5s %d steps = torch (%s)" % (kind, "K=%d" % k if k else "", D,
                                                        " ".join("%.4g" % v for v in got[:: 4])))
    print("OK schedules")


if __name__ == "__main__":
    main()
