"""The losses of --loss besides mse and cross_entropy, each equal to PyTorch's.

usage: losses.py FSDPC WORKDIR

An MLP (8 -> 32 -> 4, tanh) exported from PyTorch (Debian's 1.13) trains 5 AdamW steps (lr 1e-2, no weight
decay) at world 2 on a global batch of 12 under each of: --loss l1 (torch.nn.L1Loss), huber with
--huber-delta 0.5 (HuberLoss(delta=0.5)), smooth_l1 with --smooth-l1-beta 0.5 (SmoothL1Loss(beta=0.5)), bce
(BCEWithLogitsLoss, targets in [0, 1]) and cross_entropy with --label-smoothing 0.1
(CrossEntropyLoss(label_smoothing=0.1)); every loss and final weight within 1e-5 of PyTorch's (the
differences of the outputs and targets straddle 0.5, so huber's and smooth_l1's two branches both act).
huber with the default delta 1 differs from delta 0.5, and bce stays finite for logits of +-200 (a batch
scaled up). Bad use is one line: --huber-delta without huber, --label-smoothing 1, an unknown kind.
"""
import copy
import os
import shutil
import sys

import numpy as np
import torch

from common import check, mpirun, onnx_weights, read_metrics, rel_err, run

STEPS, GLOBAL_B, ROWS = 5, 12, 48


class MLP(torch.nn.Module):
    def __init__(self, out):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, out)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


def reference(model, loss_fn, x, t):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for s in range(STEPS):
        rows = [(s * GLOBAL_B + i) % ROWS for i in range(GLOBAL_B)]
        opt.zero_grad()
        loss = loss_fn(model(torch.from_numpy(x[rows])), torch.from_numpy(t[rows]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in model.state_dict().items()}


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 8)).astype(np.float32)
    np.save(J("x.npy"), x)
    targets = {"reg": rng.standard_normal((ROWS, 4)).astype(np.float32) * 0.6,
               "prob": rng.random((ROWS, 4)).astype(np.float32),
               "cls": rng.integers(0, 4, ROWS).astype(np.int64)}
    for k, v in targets.items():
        np.save(J("t_%s.npy" % k), v)
    torch.manual_seed(0)
    init = MLP(4)
    torch.onnx.export(copy.deepcopy(init), (torch.zeros(GLOBAL_B, 8),), J("mlp.onnx"), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17,
                      do_constant_folding=False)
    F = torch.nn.functional
    cases = [("l1", [], "reg", torch.nn.L1Loss()),
             ("huber", ["--huber-delta", "0.5"], "reg", torch.nn.HuberLoss(delta=0.5)),
             ("smooth_l1", ["--smooth-l1-beta", "0.5"], "reg", torch.nn.SmoothL1Loss(beta=0.5)),
             ("bce", [], "prob", torch.nn.BCEWithLogitsLoss()),
             ("cross_entropy", ["--label-smoothing", "0.1"], "cls", torch.nn.CrossEntropyLoss(label_smoothing=0.1))]
    got = {}
    for kind, flags, tk, fn in cases:
        ref_losses, ref_w = reference(copy.deepcopy(init), fn, x, targets[tk])
        if kind in ("huber", "smooth_l1"):  # both branches act: |y - t| on either side of 0.5
            with torch.no_grad():
                d = (init(torch.from_numpy(x)) - torch.from_numpy(targets[tk])).abs()
            check(float((d < 0.5).float().mean()) > 0.2 and float((d > 0.5).float().mean()) > 0.2,
                  "%s: differences do not straddle 0.5" % kind)
        exe = J("train_" + kind)
        run([fsdpc, J("mlp.onnx"), "-o", exe, "--target", "cpu", "--loss", "%s:y,target" % kind,
             "--dim", "batch=%d" % (GLOBAL_B // 2), "--verify"] + flags)
        run(mpirun(2, [exe, "--data", "x=" + J("x.npy"), "--data", "target=" + J("t_%s.npy" % tk), "--steps",
                       str(STEPS), "--lr", "1e-2", "--weight-decay", "0", "--metrics", exe + ".jsonl", "--export-onnx",
                       exe + ".onnx", "--quiet"]))
        losses, _ = read_metrics(exe + ".jsonl")
        for s, (a, b) in enumerate(zip(losses, ref_losses)):
            check(abs(a - b) <= 1e-5 * abs(b), "%s step %d: loss %.9g vs PyTorch %.9g" % (kind, s + 1, a, b))
        w = onnx_weights(exe + ".onnx")
        for name, ref in ref_w.items():
            e = rel_err(w[name], ref)
            check(e <= 1e-5, "%s: weight '%s' differs from PyTorch by %.3g" % (kind, name, e))
        got[kind] = losses
        print("%-14s %-26s losses %s = PyTorch's" % (kind, " ".join(flags), " ".join("%.6f" % l for l in losses)))

    # huber's delta matters; bce is stable for large logits
    exe = J("train_huber1")
    run([fsdpc, J("mlp.onnx"), "-o", exe, "--target", "cpu", "--loss", "huber:y,target", "--dim", "batch=12"])
    run([exe, "--data", "x=" + J("x.npy"), "--data", "target=" + J("t_reg.npy"), "--steps", "1", "--quiet",
         "--metrics", exe + ".jsonl"])
    l1 = read_metrics(exe + ".jsonl")[0][0]
    check(abs(l1 - got["huber"][0]) > 1e-3, "huber delta 1 gives delta 0.5's loss %.6f" % l1)
    m = copy.deepcopy(init)  # the output layer scaled up: logits in the hundreds
    with torch.no_grad():
        m.fc2.weight.mul_(400)
    torch.onnx.export(copy.deepcopy(m), (torch.zeros(GLOBAL_B, 8),), J("big.onnx"), input_names=["x"],
                      output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17,
                      do_constant_folding=False)
    exe = J("train_bce_big")
    run([fsdpc, J("big.onnx"), "-o", exe, "--target", "cpu", "--loss", "bce:y,target", "--dim", "batch=12"])
    run([exe, "--data", "x=" + J("x.npy"), "--data", "target=" + J("t_prob.npy"), "--steps", "1", "--lr", "0",
         "--quiet", "--metrics", exe + ".jsonl"])
    big = read_metrics(exe + ".jsonl")[0][0]
    with torch.no_grad():
        rows = list(range(GLOBAL_B))
        want = float(torch.nn.BCEWithLogitsLoss()(m(torch.from_numpy(x[rows])), torch.from_numpy(targets["prob"][rows])))
        top = float(m(torch.from_numpy(x[rows])).abs().max())
    check(top > 100 and np.isfinite(big) and abs(big - want) <= 1e-5 * want,
          "bce with logits up to %.0f: %.9g, PyTorch %.9g" % (top, big, want))
    print("huber delta 1: %.6f (0.5: %.6f); bce with logits up to %.0f: %.6f = PyTorch's" % (l1, got["huber"][0], top,
                                                                                            big))
    for flags, needle in ((["--loss", "l1:y,t", "--huber-delta", "2"], "--huber-delta shapes --loss huber"),
                          (["--loss", "cross_entropy:y,t", "--label-smoothing", "1"], "--label-smoothing: '1'"),
                          (["--loss", "hinge:y,t"], "unknown kind (supported: mse, cross_entropy, l1, huber")):
        p = run([fsdpc, J("mlp.onnx"), "-o", J("bad"), "--target", "cpu", "--dim", "batch=2"] + flags, check=False)
        err = p.stderr.strip().splitlines()
        check(p.returncode != 0 and len(err) == 1 and needle in err[0], "%s: exit %d %s" % (flags, p.returncode, err))
    print("OK losses")


if __name__ == "__main__":
    main()
