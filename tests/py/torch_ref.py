"""What torch_gpt.py and torch_resnet.py share: a PyTorch reference of FSDP training
at W simulated ranks, an fsdpc run, and the comparison of losses and step-1 gradients.

The reference: one model, W simulated ranks per step.  Each rank's loss is computed
on its own slice of the global batch in its own forward call (so BatchNorm in
training mode normalises by that rank's local batch statistics, as each FSDP/DDP
rank does without SyncBatchNorm), backward of loss_r / W accumulates the average
of the ranks' gradients (what fsdpc's reduce-scatter computes), the step's loss
is the mean of the ranks' losses (what fsdpc reports), and one AdamW step follows.
Since every rank holds the same parameters, this equals W replicas stepping in
lockstep with averaged gradients.  (BatchNorm running statistics are updated once
per simulated rank; they do not enter training-mode forward passes.)
"""
import os

import numpy as np
import torch

from common import check, mpirun, read_metrics, rel_err, run

ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def adamw_flags():
    return ["--lr", repr(ADAMW["lr"]), "--beta1", repr(ADAMW["betas"][0]), "--beta2", repr(ADAMW["betas"][1]),
            "--eps", repr(ADAMW["eps"]), "--weight-decay", repr(ADAMW["weight_decay"])]


def reference(model, loss_fn, rank_batches, world, steps):
    """rank_batches(s, world) -> [(inputs, labels)] * world: the ranks' slices of step s.
    Returns (losses, step-1 gradients by parameter name)."""
    model.train()
    # fsdpc's default: no weight decay on parameters of rank < 2 (biases, norm scales), as nanoGPT groups them
    ps = list(model.parameters())
    groups = [{"params": [p for p in ps if p.dim() >= 2]},
              {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], amsgrad=False, maximize=False, foreach=False,
                            **ADAMW)
    losses, grads = [], None
    for s in range(steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for x, y in rank_batches(s, world):
            loss = loss_fn(model, x, y)
            (loss / world).backward()
            total += loss.item()
        losses.append(total / world)
        if s == 0:
            grads = {n: p.grad.detach().clone().numpy() for n, p in model.named_parameters()}
        opt.step()
    return losses, grads


def safe_name(name):
    """the file name fsdpc gives a parameter in --dump-grads (as --eval outputs)"""
    out = "".join(ch if (ch.isascii() and (ch.isalnum() or ch in "_.-")) else "_" for ch in name)
    if out.startswith("."):
        out = "_" + out[1:]
    return out + ".npy"


def compile_exe(fsdpc, onnx_path, exe, batch, extra=()):
    run([fsdpc, onnx_path, "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels",
         "--optimizer", "adamw", "--dim", "batch=%d" % batch, "--wrap", "size:2000", "--verify"] + list(extra),
        timeout=1800)


def train_exe(exe, world, data_flags, steps, work):
    """run exe for `steps` AdamW steps, gradients of step 1 dumped; returns (losses, dump dir)"""
    dump = exe + ".grads"
    metrics = exe + ".jsonl"
    run(mpirun(world, [exe] + list(data_flags) + ["--steps", str(steps), "--metrics", metrics,
                                                  "--dump-grads", dump, "--quiet"] + adamw_flags()),
        timeout=3600)
    losses, mem = read_metrics(metrics)
    check(len(losses) == steps, "%s: %d losses, expected %d" % (exe, len(losses), steps))
    check(mem is not None and mem["world"] == world, "%s: no memory report for world %d" % (exe, world))
    return losses, dump


def compare_to_oracle(tag, model, ref_loss, ref_grads, f32_loss, f32_grads, loss, dump, floor=1e-5, factor=3.0,
                      kind="float32"):
    """Step 1 of a float32 fsdpc run against a float64 PyTorch oracle, where float32 itself
    cannot reach a fixed tolerance: fsdpc's error must be at most max(floor, factor x PyTorch
    float32's error) for the loss and for every parameter's gradient.  kind: what fsdpc and
    PyTorch ran in (f32_loss, f32_grads: PyTorch's), named in the messages."""
    def ok(err, ref_err):
        return err <= max(floor, factor * ref_err)
    e, e32 = abs(loss - ref_loss) / abs(ref_loss), abs(f32_loss - ref_loss) / abs(ref_loss)
    check(ok(e, e32), "%s: step 1 loss %.9g vs PyTorch float64 %.9g: error %.3g, PyTorch %s's %.3g"
          % (tag, loss, ref_loss, e, kind, e32))
    sd = model.state_dict(keep_vars=True)
    files = set(os.listdir(dump))
    worst = (0.0, 0.0, "")
    for name, p in model.named_parameters():
        hits = [k for k, v in sd.items() if v is p and safe_name(k) in files]
        check(len(hits) == 1, "%s: parameter %s: %d gradient files in %s" % (tag, name, len(hits), dump))
        g = np.load(os.path.join(dump, safe_name(hits[0])))
        ref = ref_grads[name]
        check(g.shape == ref.shape, "%s: gradient of %s has shape %s, PyTorch %s" % (tag, name, g.shape, ref.shape))
        err, err32 = rel_err(g, ref), rel_err(f32_grads[name], ref)
        worst = max(worst, (err / max(floor, factor * err32), err, name))
        check(ok(err, err32), "%s: gradient of %s: error %.3g against float64, PyTorch %s's %.3g"
              % (tag, name, err, kind, err32))
    print("%s: %s step 1 vs PyTorch float64: loss error %.2g (PyTorch %s %.2g); gradients within "
          "max(%g, %g x PyTorch %s's error) (closest: %s, %.2g)" % (tag, kind, e, kind, e32, floor, factor, kind,
                                                                    worst[2], worst[1]))


def compare(tag, model, ref_losses, ref_grads, losses, dump, grad_tol=1e-5, loss1_tol=1e-5, loss_tol=1e-4):
    """step-1 loss and every parameter's gradient, then every loss"""
    a, b = losses[0], ref_losses[0]
    check(abs(a - b) <= loss1_tol * abs(b), "%s: step 1 loss %.9g vs PyTorch %.9g (rel %.3g)"
          % (tag, a, b, abs(a - b) / abs(b)))
    # every trainable parameter: one file, under one of its names (tied weights: one initializer)
    sd = model.state_dict(keep_vars=True)
    files = set(os.listdir(dump))
    seen, worst = set(), (0.0, "")
    for name, p in model.named_parameters():
        aliases = [k for k, v in sd.items() if v is p]
        hits = [k for k in aliases if safe_name(k) in files]
        check(len(hits) == 1, "%s: parameter %s (aliases %s): %d gradient files in %s"
              % (tag, name, aliases, len(hits), dump))
        f = safe_name(hits[0])
        seen.add(f)
        g = np.load(os.path.join(dump, f))
        ref = ref_grads[name]
        check(g.size == ref.size, "%s: gradient of %s has %d elements, PyTorch %d" % (tag, name, g.size, ref.size))
        check(g.shape == ref.shape, "%s: gradient of %s has shape %s, PyTorch %s" % (tag, name, g.shape, ref.shape))
        e = rel_err(g, ref)
        worst = max(worst, (e, name))
        check(e <= grad_tol, "%s: gradient of %s differs from PyTorch by %.3g (norm-wise relative; max|ref| %.3g)"
              % (tag, name, e, float(np.max(np.abs(ref)))))
    extra = files - seen
    check(not extra, "%s: gradients of non-parameters dumped: %s" % (tag, sorted(extra)[:10]))
    for s, (a, b) in enumerate(zip(losses, ref_losses)):
        check(abs(a - b) <= loss_tol * abs(b), "%s: step %d loss %.9g vs PyTorch %.9g (rel %.3g)"
              % (tag, s + 1, a, b, abs(a - b) / abs(b)))
    print("%s: step-1 loss and %d gradients match (worst %.2g: %s); %d losses match (max rel %.2g)"
          % (tag, len(seen), worst[0], worst[1], len(losses),
             max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))))
