"""Float32 accuracy against float64: fsdpc's step-1 gradients and PyTorch float32's, both against PyTorch float64.

usage: python3 bench/f32_accuracy.py [--model mobilenet_v2] [--batch 4] [--size 64] [--seed 0] [--rows]
                                     [--fsdpc build/fsdpc] [--work DIR]

With the pyenv python3 (torch 2, torchvision; docs/precision.md "Float32 and float64 accuracy").  A torchvision
classifier (10 classes, seeded, Dropout replaced by Identity: masks differ between runs) in training mode is
exported once in float32 (TorchScript exporter, training-mode BatchNorm, opset 17).  fsdpc compiles it
(--target cpu, cross-entropy, AdamW) and runs one step at world 1 on --batch random images, dumping its
gradients (--dump-grads).  PyTorch computes the same step's gradients in float32 and in float64.  For each
parameter it prints the max-norm relative error (max |g - g64| / max |g64|) of fsdpc and of PyTorch float32, then
the medians and how many tensors fsdpc is more than 10x worse on.  Tensors whose exact gradient is 0 are left out:
a BatchNorm bias feeding another training-mode BatchNorm gets only rounding noise, and PyTorch float32's error is
above 1 there.

It also counts ReLU/ReLU6 sign flips.  These are activation inputs on the other side of 0 (or 6) from float64, in
fsdpc's forward (an --eval build with those inputs as outputs) and in PyTorch float32's.  With few values per
BatchNorm channel (a small batch at the last 1x1 stages) each flip decides a gradient path, and then the medians
measure that chance rather than the arithmetic.
"""
import argparse
import copy
import os
import subprocess
import sys
import warnings

import numpy as np
import onnx
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "py"))
from common import rel_err, run  # noqa: E402
from torch_ref import safe_name  # noqa: E402

ACTS = (torch.nn.ReLU, torch.nn.ReLU6)


def build(name, seed):
    torch.manual_seed(seed)
    model = getattr(torchvision.models, name)(num_classes=10)
    for mod in list(model.modules()):
        for k, ch in list(mod.named_children()):
            if isinstance(ch, torch.nn.Dropout):
                setattr(mod, k, torch.nn.Identity())
    return model.train()


def export(model, x, path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(copy.deepcopy(model), (torch.from_numpy(x),), path, opset_version=17, dynamo=False,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=["x"], output_names=["logits"])


def torch_step(model, x, y, dtype):
    """(loss, gradients by name, the inputs of every ReLU / ReLU6 in call order)"""
    m = copy.deepcopy(model).to(dtype)
    acts = []
    for mod in m.modules():
        if isinstance(mod, ACTS):
            mod.register_forward_pre_hook(lambda mod, i: acts.append(i[0].detach().clone().double().numpy()))
    loss = torch.nn.functional.cross_entropy(m(torch.from_numpy(x).to(dtype)), torch.from_numpy(y))
    loss.backward()
    return loss.item(), {n: p.grad.double().numpy() for n, p in m.named_parameters()}, acts


def fsdpc_step(fsdpc, onnx_path, x, y, work):
    for name, a in (("x", x), ("labels", y)):
        np.save(os.path.join(work, name + ".npy"), a)
    exe, dump = os.path.join(work, "train"), os.path.join(work, "grads")
    run([fsdpc, onnx_path, "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels",
         "--optimizer", "adamw"], timeout=3600)
    run([exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "labels=" + os.path.join(work, "labels.npy"),
         "--steps", "1", "--dump-grads", dump, "--quiet"], timeout=3600)
    return dump


def fsdpc_acts(fsdpc, onnx_path, x, work):
    """the inputs of every Relu / Clip node, from an --eval build that outputs them"""
    m = onnx.load(onnx_path)
    names = [n.input[0] for n in m.graph.node if n.op_type in ("Relu", "Clip")]
    for v in names:
        m.graph.output.append(onnx.helper.make_empty_tensor_value_info(v))
    path, exe, out = (os.path.join(work, f) for f in ("acts.onnx", "acts", "acts_out"))
    onnx.save(m, path)
    run([fsdpc, path, "-o", exe, "--target", "cpu", "--eval"], timeout=3600)
    run([exe, "--input", "x=" + os.path.join(work, "x.npy"), "--out-dir", out], timeout=3600)
    return [np.load(os.path.join(out, safe_name(v))).astype(np.float64) for v in names]


def flips(acts, ref):
    if len(acts) != len(ref) or any(a.shape != b.shape for a, b in zip(acts, ref)):
        sys.exit("f32_accuracy: the ONNX graph's activations do not match the module's calls")
    return sum(int(np.sum((a > 0) != (b > 0)) + np.sum((a < 6) != (b < 6))) for a, b in zip(acts, ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", action="store_true", help="print every tensor's errors")
    ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
    ap.add_argument("--work", default="/tmp/f32_accuracy")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    torch.set_num_threads(1)
    model = build(a.model, a.seed)
    rng = np.random.default_rng(a.seed)
    x = rng.standard_normal((a.batch, 3, a.size, a.size)).astype(np.float32)
    y = rng.integers(0, 10, a.batch).astype(np.int64)
    onnx_path = os.path.join(a.work, "model.onnx")
    export(model, x, onnx_path)
    l64, g64, a64 = torch_step(model, x, y, torch.float64)
    l32, g32, a32 = torch_step(model, x, y, torch.float32)
    dump = fsdpc_step(a.fsdpc, onnx_path, x, y, a.work)
    ef, et = [], []
    for n in g64:
        e_t = rel_err(g32[n], g64[n])
        if e_t > 1:  # an exact zero gradient: noise in both
            continue
        e_f = rel_err(np.load(os.path.join(dump, safe_name(n))), g64[n])
        ef.append(e_f)
        et.append(e_t)
        if a.rows:
            print("%-44s fsdpc %.3g  torch float32 %.3g" % (n, e_f, e_t))
    worse = sum(f > 10 * t for f, t in zip(ef, et))
    print("%s batch %d %dx%d seed %d: step-1 gradients against PyTorch float64, median relative error: fsdpc %.3g, "
          "PyTorch float32 %.3g; fsdpc more than 10x worse in %d of %d tensors"
          % (a.model, a.batch, a.size, a.size, a.seed, np.median(ef), np.median(et), worse, len(ef)))
    print("ReLU/ReLU6 inputs on the other side of 0 or 6 from float64: fsdpc %d, PyTorch float32 %d"
          % (flips(fsdpc_acts(a.fsdpc, onnx_path, x, a.work), a64), flips(a32, a64)))


if __name__ == "__main__":
    main()
