"""ResNet-18 training step on the CPU: fsdpc with its convolutions on oneDNN (the default rule) and on im2col +
OpenBLAS (FSDPC_CONV=im2col), against PyTorch 2 eager and torch.compile; CPU time per step at 1 thread.

    /usr/bin/python3 bench/resnet_cpu.py [--fsdpc build/fsdpc] [--batch 8] [--size 112] [--repeat 3]
                                         [--torch2 PYTHON]

torchvision's resnet18(num_classes=10), exported by Debian's torch 1.13 in training mode (BatchNorm on the batch's
statistics), one batch of random images and labels; a step = forward + cross-entropy + backward + AdamW.  fsdpc's
CPU time per step is the difference of the executable's CPU time (getrusage of the child) between a run of 2 and
one of 2 + N steps, so start-up and the first step (primitive creation) are not counted; PyTorch's is
time.process_time per step after two warm-up steps (torch.compile's compilation among them), the median.  The
three fsdpc / PyTorch measurements are interleaved, --repeat times; every figure printed is the median over the
repetitions.  1 thread everywhere (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS, torch.set_num_threads):
CPU time at 1 thread is what a shared machine's load does not distort.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import warnings

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from torch2 import torch2_python  # noqa: E402

ENV1 = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}

TORCH_SIDE = r"""
import json, os, sys, time
import numpy as np, torch, torchvision
mode, d, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)
model = torchvision.models.resnet18(num_classes=10)
x = torch.from_numpy(np.load(os.path.join(d, "x.npy"))); y = torch.from_numpy(np.load(os.path.join(d, "y.npy")))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
fwd = torch.compile(model) if mode == "compile" else model
cpu = []
for _ in range(steps + 2):
    c = time.process_time()
    opt.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(fwd(x), y)
    loss.backward()
    opt.step()
    cpu.append(time.process_time() - c)
print(json.dumps({"torch": torch.__version__, "cpu_s": sorted(cpu[2:])[len(cpu[2:]) // 2]}))
"""


def export(d, batch, size):
    """model.onnx, x.npy, y.npy in d (Debian's torch 1.13, training-mode export as tests/py/torch_resnet.py)"""
    import torch
    import torchvision
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    x = torch.zeros(batch, 3, size, size)
    with warnings.catch_warnings():  # "Removing mutation from node aten::add_ on ... num_batches_tracked"
        warnings.simplefilter("ignore", UserWarning)
        torch.onnx.export(model, (x,), os.path.join(d, "model.onnx"), opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, input_names=["x"],
                          output_names=["logits"])
    rng = np.random.default_rng(0)
    np.save(os.path.join(d, "x.npy"), rng.standard_normal((batch, 3, size, size)).astype(np.float32))
    np.save(os.path.join(d, "y.npy"), rng.integers(0, 10, batch).astype(np.int64))


def child_cpu(cmd, env):
    """CPU seconds (user + system) the command took"""
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)


def fsdpc_step(exe, d, steps, conv):
    """fsdpc's CPU seconds per step with FSDPC_CONV=conv ('' for the default rule)"""
    env = dict(os.environ, **ENV1)
    if conv:
        env["FSDPC_CONV"] = conv
    base = [exe, "--data", "x=%s" % os.path.join(d, "x.npy"), "--data", "labels=%s" % os.path.join(d, "y.npy"),
            "--quiet"]
    t0 = child_cpu(base + ["--steps", "2"], env)
    t1 = child_cpu(base + ["--steps", str(2 + steps)], env)
    return (t1 - t0) / steps


def torch_step(py, mode, d, steps):
    env = dict(os.environ, **ENV1)
    out = subprocess.run([py, "-c", TORCH_SIDE, mode, d, str(steps)], env=env, check=True, capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["cpu_s"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--size", type=int, default=112)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--torch2", default=None, help="a python with torch >= 2 and torchvision ('none': leave out)")
    a = ap.parse_args()
    py2, _ = torch2_python(a.torch2)
    d = tempfile.mkdtemp(prefix="fsdpc-resnet-")
    export(d, a.batch, a.size)
    exe = os.path.join(d, "train")
    subprocess.run([a.fsdpc, os.path.join(d, "model.onnx"), "-o", exe, "--target", "cpu", "--loss",
                    "cross_entropy:logits,labels", "--optimizer", "adamw", "--wrap", "size:2000"], check=True)
    sides = {"fsdpc onednn": lambda: fsdpc_step(exe, d, a.steps, ""),
             "fsdpc im2col": lambda: fsdpc_step(exe, d, a.steps, "im2col")}
    if py2:
        sides["torch eager"] = lambda: torch_step(py2, "eager", d, a.steps)
        sides["torch compile"] = lambda: torch_step(py2, "compile", d, a.steps)
    got = {k: [] for k in sides}
    for r in range(a.repeat):
        for k, f in sides.items():
            got[k].append(f())
        print("repetition %d: %s" % (r + 1, ", ".join("%s %.1f ms" % (k, v[-1] * 1e3) for k, v in got.items())),
              flush=True)
    med = {k: sorted(v)[len(v) // 2] for k, v in got.items()}
    print("ResNet-18 %dx%d batch %d, CPU time per step at 1 thread (median of %d):" % (a.size, a.size, a.batch,
                                                                                     a.repeat))
    for k, v in med.items():
        rel = "".join(" %.2fx %s" % (v / med[o], o) for o in med if o != k and o.startswith("torch"))
        print("  %-14s %8.1f ms%s" % (k, v * 1e3, rel))


if __name__ == "__main__":
    main()
