"""An MLP exported from PyTorch trains in fsdpc exactly as in PyTorch.

usage: torch_mlp.py FSDPC WORKDIR adamw|adam|sgd

PyTorch (Debian's 1.13, CPU) trains the model for 5 steps on a global batch
of 12; fsdpc compiles the exported ONNX with the per-rank batch 12/W and runs
it at W = 1, 2, 3, 4 ranks.  Losses and final weights must match PyTorch
within 1e-5 (norm-wise relative), and per-rank model state must shrink as 1/W.
The --export-safetensors file holds the same tensors as the ONNX export.
Then the same executables at W = 1, 2, 3 with the run flags --clip-grad-norm
and --lr-schedule cosine (warmup, decay, min-lr) for 8 steps against PyTorch's
clip_grad_norm_ and a LambdaLR of the same schedule: losses and weights within
1e-5, the metrics' grad_norm (before clipping) within 1e-5 of the norm
clip_grad_norm_ returns (clipping active on some steps, not on others), and
their lr equal to the scheduler's.  --freeze fc1.*: the rest matches PyTorch,
fc1 stays as exported, and the --export-safetensors file holds every
initializer of the ONNX export, fc1's with their original values (a strict
load_state_dict of it succeeds).
"""
import math
import copy
import os
import sys

import json

import numpy as np
import torch

from common import check, mpirun, onnx_weights, read_metrics, rel_err, run

STEPS, GLOBAL_B, ROWS = 5, 12, 48


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 32)
        self.fc2 = torch.nn.Linear(32, 32)
        self.fc3 = torch.nn.Linear(32, 4)

    def forward(self, x):
        return torch.sigmoid(self.fc3(torch.relu(self.fc2(torch.tanh(self.fc1(x))))))


def read_safetensors(path):
    """name -> array of a safetensors file, checked against the format: 8-byte header length, JSON header,
    tensors back to back in the data section"""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    check(n % 8 == 0 and 8 + n <= len(raw), "%s: header length %d" % (path, n))
    hdr = json.loads(raw[8:8 + n])
    out, end = {}, 0
    for name, t in hdr.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        dt = {"F32": np.float32, "F64": np.float64}[t["dtype"]]
        arr = np.frombuffer(raw[8 + n + a:8 + n + b], dt)
        check(arr.size == int(np.prod(t["shape"])), "%s: %s: %d elements for shape %s" % (path, name, arr.size,
                                                                                         t["shape"]))
        out[name] = arr.reshape(t["shape"])
        end = max(end, b)
    check(8 + n + end == len(raw), "%s: %d bytes past the tensors" % (path, len(raw) - 8 - n - end))
    return out


def export(model, path):
    x = torch.zeros(GLOBAL_B, 8)
    torch.onnx.export(model, (x,), path, input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)


# the clipped, scheduled run: steps, clip, warmup, decay steps, min lr (as a fraction of lr)
SCHED_STEPS, CLIP, WARMUP, DECAY, MIN_FRAC = 8, 0.038, 2, 7, 0.2


def sched_lr(lr, step):
    """fsdpc's --lr-schedule cosine at 1-based step"""
    if step <= WARMUP:
        return lr * step / WARMUP
    if step >= DECAY:
        return lr * MIN_FRAC
    t = (step - WARMUP) / (DECAY - WARMUP)
    return lr * MIN_FRAC + 0.5 * (lr - lr * MIN_FRAC) * (1 + math.cos(math.pi * t))


def reference(model, opt_name, x, t, steps=STEPS, clip=None, decays=lambda name, p: p.dim() >= 2, nesterov=False,
              mult=lambda name: 1.0):
    """losses, weights, and with clip (then also the cosine schedule) the norms and lrs of each step; weight
    decay on the parameters decays(name, p) says (default: rank >= 2, fsdpc's default), the learning rate
    times mult(name): one param group per (decay, factor)"""
    wd = 1e-3 if opt_name == "sgd" else 0.01
    base = 1e-2 if opt_name != "sgd" else 0.1
    ps = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    keys = sorted({(decays(n, p), mult(n)) for n, p in ps})
    groups = [{"params": [p for n, p in ps if (decays(n, p), mult(n)) == k], "weight_decay": wd if k[0] else 0.0,
               "lr": base * k[1]} for k in keys]
    if opt_name == "adamw":
        opt = torch.optim.AdamW(groups, lr=base)
    elif opt_name == "adam":  # the weight decay added to the gradient
        opt = torch.optim.Adam(groups, lr=base)
    else:
        opt = torch.optim.SGD(groups, lr=base, momentum=0.9, nesterov=nesterov)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: sched_lr(base, e + 1) / base) if clip else None
    losses, norms, lrs = [], [], []
    for s in range(steps):
        rows = [(s * GLOBAL_B + i) % ROWS for i in range(GLOBAL_B)]
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(torch.from_numpy(x[rows])), torch.from_numpy(t[rows]))
        loss.backward()
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_([p for _, p in ps], clip)))
            lrs.append(opt.param_groups[0]["lr"] / keys[0][1])  # the base rate: a group's over its factor
        opt.step()
        if sched:
            sched.step()
        losses.append(loss.item())
    return losses, {k: v.detach().numpy() for k, v in model.state_dict().items()}, norms, lrs


def main():
    fsdpc, work, opt_name = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 8)).astype(np.float32)
    t = rng.random((ROWS, 4)).astype(np.float32)
    np.save(os.path.join(work, "x.npy"), x)
    np.save(os.path.join(work, "t.npy"), t)
    model = MLP()
    onnx_path = os.path.join(work, "mlp.onnx")
    export(model, onnx_path)
    init = copy.deepcopy(model)
    ref_losses, ref_w, _, _ = reference(model, opt_name, x, t)
    hyper = ["--lr", "0.01", "--weight-decay", "0.01"] if opt_name != "sgd" else \
        ["--lr", "0.1", "--momentum", "0.9", "--weight-decay", "0.001"]

    state = {}
    for world in (1, 2, 3, 4):
        exe = os.path.join(work, "train_w%d" % world)
        run([fsdpc, onnx_path, "-o", exe, "--target", "cpu", "--loss", "mse:y,target",
             "--optimizer", opt_name, "--dim", "batch=%d" % (GLOBAL_B // world), "--wrap", "size:200",
             "--verify"])
        metrics, out, st = exe + ".jsonl", exe + ".onnx", exe + ".safetensors"
        run(mpirun(world, [exe, "--data", "x=" + os.path.join(work, "x.npy"),
                           "--data", "target=" + os.path.join(work, "t.npy"), "--steps", str(STEPS),
                           "--metrics", metrics, "--export-onnx", out, "--export-safetensors", st] + hyper))
        losses, mem = read_metrics(metrics)
        check(len(losses) == STEPS, "world %d: %d losses, expected %d" % (world, len(losses), STEPS))
        for s, (a, b) in enumerate(zip(losses, ref_losses)):
            check(abs(a - b) <= 1e-5 * abs(b), "world %d step %d: loss %.9g vs PyTorch %.9g" % (world, s, a, b))
        w = onnx_weights(out)
        for name, ref in ref_w.items():
            check(name in w, "world %d: exported model lacks '%s'" % (world, name))
            check(w[name].shape == ref.shape and w[name].dtype == ref.dtype,
                  "world %d: '%s' exported as %s %s" % (world, name, w[name].dtype, w[name].shape))
            e = rel_err(w[name], ref)
            check(e <= 1e-5, "world %d: weight '%s' differs from PyTorch by %.3g (relative)" % (world, name, e))
        check(mem is not None and mem["world"] == world, "world %d: no memory report" % world)
        sw = read_safetensors(st)
        check(sorted(sw) == sorted(w) and all(np.array_equal(sw[k], w[k]) for k in w),
              "world %d: the safetensors export differs from the ONNX export: %s vs %s" % (world, sorted(sw), sorted(w)))
        state[world] = mem
        print("world %d: losses %s, state/rank %d of %d B" % (world, " ".join("%.6f" % l for l in losses),
                                                         mem["state_bytes"], mem["model_state_bytes"]))
    total = state[1]["model_state_bytes"]
    full_read = state[1]["init_param_bytes_read"]
    for world, mem in state.items():
        # deferred init: no rank reads more than its own shard of each of the 3 units
        bound = full_read // world + 3 * 4
        check(mem["init_param_bytes_read_max"] <= bound, "world %d: a rank read %d B of initial parameters, "
              "its shard is <= %d B" % (world, mem["init_param_bytes_read_max"], bound))
    for world, mem in state.items():
        # shards are ceil(n/W) per unit, each rounded to 64 B: allow that slack only
        slack = 3 * 4 * 64 * 4
        check(abs(mem["state_bytes"] * world - total) <= slack * world,
              "world %d: per-rank state %d B is not ~1/%d of %d B" % (world, mem["state_bytes"], world, total))

    # run flags on the same executables: clipping by the global norm, a cosine schedule with warmup
    ref_losses, ref_w, ref_norms, ref_lrs = reference(copy.deepcopy(init), opt_name, x, t, SCHED_STEPS, CLIP)
    check(min(ref_norms) < CLIP < max(ref_norms), "the test wants clipping active on some steps only: norms %s"
          % ref_norms)
    base = float(hyper[1])
    sched = ["--clip-grad-norm", str(CLIP), "--lr-schedule", "cosine", "--warmup-steps", str(WARMUP),
             "--decay-steps", str(DECAY), "--min-lr", repr(base * MIN_FRAC)]
    for world in (1, 2, 3):
        exe = os.path.join(work, "train_w%d" % world)
        metrics, out = exe + ".clip.jsonl", exe + ".clip.onnx"
        run(mpirun(world, [exe, "--data", "x=" + os.path.join(work, "x.npy"),
                           "--data", "target=" + os.path.join(work, "t.npy"), "--steps", str(SCHED_STEPS),
                           "--metrics", metrics, "--export-onnx", out] + hyper + sched))
        rows = [json.loads(l) for l in open(metrics) if '"step"' in l]
        check(len(rows) == SCHED_STEPS, "clip world %d: %d steps" % (world, len(rows)))
        for s, (r, lb, nb, lrb) in enumerate(zip(rows, ref_losses, ref_norms, ref_lrs)):
            check(abs(r["loss"] - lb) <= 1e-5 * abs(lb), "clip world %d step %d: loss %.9g vs PyTorch %.9g"
                  % (world, s + 1, r["loss"], lb))
            check(abs(r["grad_norm"] - nb) <= 1e-5 * nb, "clip world %d step %d: grad_norm %.9g vs PyTorch %.9g"
                  % (world, s + 1, r["grad_norm"], nb))
            check(abs(r["lr"] - lrb) <= 1e-12 * lrb, "clip world %d step %d: lr %.17g vs PyTorch %.17g"
                  % (world, s + 1, r["lr"], lrb))
        w = onnx_weights(out)
        for name, ref in ref_w.items():
            e = rel_err(w[name], ref)
            check(e <= 1e-5, "clip world %d: weight '%s' differs from PyTorch by %.3g" % (world, name, e))
        print("clip world %d: norms %s (clip %g), lrs %s match" % (world, " ".join("%.4f" % r["grad_norm"] for r in rows),
                                                                   CLIP, " ".join("%.4g" % r["lr"] for r in rows)))

    # --freeze: fc1 stays as exported (no gradient, no optimizer state), the rest trains as in PyTorch
    frozen = copy.deepcopy(init)
    for p in frozen.fc1.parameters():
        p.requires_grad_(False)
    ref_losses, ref_w, _, _ = reference(frozen, opt_name, x, t)
    init_w = {k: v.detach().numpy() for k, v in init.state_dict().items()}
    for world in (1, 2):
        exe = os.path.join(work, "freeze_w%d" % world)
        run([fsdpc, onnx_path, "-o", exe, "--target", "cpu", "--loss", "mse:y,target", "--optimizer", opt_name,
             "--dim", "batch=%d" % (GLOBAL_B // world), "--wrap", "size:200", "--freeze", "fc1.*", "--verify"])
        metrics, out, st = exe + ".jsonl", exe + ".onnx", exe + ".safetensors"
        run(mpirun(world, [exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "target=" + os.path.join(
            work, "t.npy"), "--steps", str(STEPS), "--metrics", metrics, "--export-onnx", out,
            "--export-safetensors", st] + hyper))
        losses, mem = read_metrics(metrics)
        for s, (a, b) in enumerate(zip(losses, ref_losses)):
            check(abs(a - b) <= 1e-5 * abs(b), "freeze world %d step %d: loss %.9g vs PyTorch %.9g" % (world, s, a, b))
        w = onnx_weights(out)
        for name, ref in ref_w.items():
            check(rel_err(w[name], ref) <= 1e-5, "freeze world %d: weight '%s' differs from PyTorch" % (world, name))
        sw = read_safetensors(st)  # every initializer, the frozen ones too: a strict load_state_dict works
        check(sorted(sw) == sorted(w) and all(np.array_equal(sw[k], w[k]) for k in w),
              "freeze world %d: the safetensors export differs from the ONNX export: %s vs %s" % (world, sorted(sw), sorted(w)))
        for name in ("fc1.weight", "fc1.bias"):
            check(np.array_equal(w[name], init_w[name]), "freeze world %d: frozen %s changed" % (world, name))
            check(np.array_equal(sw[name], init_w[name]), "freeze world %d: frozen %s in safetensors" % (world, name))
        strict = copy.deepcopy(init)
        strict.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in sw.items()}, strict=True)
        n, nfc1 = sum(v.size for v in init_w.values()), 8 * 32 + 32
        check(mem["model_state_bytes"] * n == state[1]["model_state_bytes"] * (n - nfc1),
              "freeze world %d: model state %d B, expected the whole model's without fc1's %d of %d parameters"
              % (world, mem["model_state_bytes"], nfc1, n))
        print("freeze world %d: fc1 unchanged, the rest matches PyTorch; model state %d B"
              % (world, mem["model_state_bytes"]))
    def against(world, tag, flags, ref):
        """the world-W executable run with run flags, its losses and exported weights against PyTorch's (ref);
        returns (stdout, exported weights)"""
        exe = os.path.join(work, "train_w%d" % world)
        metrics, out = "%s.%s.jsonl" % (exe, tag), "%s.%s.onnx" % (exe, tag)
        p = run(mpirun(world, [exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "target=" + os.path.join(
            work, "t.npy"), "--steps", str(STEPS), "--metrics", metrics, "--export-onnx", out] + hyper + flags))
        losses, _ = read_metrics(metrics)
        for s, (a, b) in enumerate(zip(losses, ref[0])):
            check(abs(a - b) <= 1e-5 * abs(b), "%s world %d step %d: loss %.9g vs PyTorch %.9g" % (flags, world, s,
                                                                                                  a, b))
        w = onnx_weights(out)
        for name, r in ref[1].items():
            check(rel_err(w[name], r) <= 1e-5, "%s world %d: weight '%s' differs from PyTorch" % (flags, world, name))
        return p.stdout, w

    # --no-decay: patterns name the parameters weight decay skips (replacing the rank < 2 default); none: all decay
    for flags, rule in ((["--no-decay", "fc2.*", "--no-decay", "fc3.bias"],
                         lambda n, p: not (n.startswith("fc2.") or n == "fc3.bias")),
                        (["--no-decay", "none"], lambda n, p: True)):
        out, _ = against(3, "nd", flags, reference(copy.deepcopy(init), opt_name, x, t, decays=rule))
        nd = sum(1 for n, q in init.named_parameters() if rule(n, q))
        check("weight decay %g on %d of 6 parameters" % (float(hyper[-1]), nd) in out,
              "%s: the start-up line: %s" % (flags, out))
        print("%s world 3: matches PyTorch with weight decay on %d of 6 parameters" % (" ".join(flags), nd))
    # --lr-mult: fc2 at 0.3 times the learning rate, fc3's weight at 2 times, fc3's bias at 5 (the first
    # pattern that matches counts), fc1 at 1
    against(2, "mult", ["--lr-mult", "fc2.*=0.3", "--lr-mult", "fc3.weight=2", "--lr-mult", "fc3.*=5"],
            reference(copy.deepcopy(init), opt_name, x, t, mult=lambda n: 0.3 if n.startswith("fc2.") else
                      2.0 if n == "fc3.weight" else 5.0 if n.startswith("fc3.") else 1.0))
    print("--lr-mult fc2.*=0.3 fc3.weight=2 fc3.*=5 world 2: matches PyTorch's param groups")
    if opt_name == "sgd":  # Nesterov momentum, at world 2
        _, w = against(2, "nesterov", ["--nesterov"], reference(copy.deepcopy(init), opt_name, x, t, nesterov=True))
        plain = onnx_weights(os.path.join(work, "train_w2.onnx"))
        check(any(rel_err(w[k], plain[k]) > 1e-4 for k in w), "--nesterov trains as plain momentum")
        print("--nesterov world 2: matches PyTorch's SGD(nesterov=True)")
    for flags, needle in ((["--no-decay", "nothing*"], "--no-decay nothing*: no parameter's name matches it"),
                          (["--no-decay", "none", "--no-decay", "fc1.*"], "--no-decay none (every parameter decays) "
                                                                          "goes alone"),
                          (["--nesterov"], "--nesterov is SGD's" if opt_name != "sgd" else "--nesterov needs --momentum"),
                          (["--lr-mult", "fc9.*=2"], "--lr-mult fc9.*: no parameter's name matches it"),
                          (["--lr-mult", "fc1.weight"], "--lr-mult expects PATTERN=X"),
                          (["--lr-mult", "fc1.weight=-1"], "--lr-mult")):
        p = run([os.path.join(work, "train_w1"), "--data", "x=" + os.path.join(work, "x.npy"), "--data",
                 "target=" + os.path.join(work, "t.npy"), "--steps", "1"] + flags, check=False)
        err = p.stderr.strip().splitlines()
        check(p.returncode == 2 and len(err) == 1 and needle in err[0], "%s: exit %d %s" % (flags, p.returncode, err))
    print("OK torch_mlp %s: 5 steps match PyTorch at world 1-4 (no weight decay on biases: the default); clipped "
          "and scheduled at world 1-3; frozen fc1; --no-decay patterns and none; --lr-mult" % opt_name)


if __name__ == "__main__":
    main()
