"""Shared helpers for the Python-driven tests (run with Debian's /usr/bin/python3).

Each test script compiles a model with fsdpc, runs the executable at one or
more world sizes and compares against an independent reference.  Failures
raise; the script exits non-zero with the message.
"""
import json
import os
import shutil
import subprocess
import warnings

import numpy as np


def run(cmd, check=True, env=None, timeout=600):
    e = dict(os.environ)
    e.setdefault("OPENBLAS_NUM_THREADS", "1")
    e.setdefault("OMP_NUM_THREADS", "1")
    if env:
        e.update(env)
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if check and p.returncode != 0:
        raise SystemExit("FAILED (%d): %s\nstdout:\n%s\nstderr:\n%s"
                         % (p.returncode, " ".join(cmd), p.stdout[-4000:], p.stderr[-4000:]))
    return p


def keep_work():
    """FSDPC_KEEP_WORK=1: every file a test writes stays (by default what was checked is removed: tests/py/run.py)"""
    return os.environ.get("FSDPC_KEEP_WORK", "") not in ("", "0")


def tidy(folder):
    """removes a folder whose checks passed (kept under FSDPC_KEEP_WORK=1)"""
    if not keep_work():
        shutil.rmtree(folder, ignore_errors=True)


def drop(*exes, keep=()):
    """removes each executable and its companions beside it (NAME.init, NAME.grads, NAME.jsonl...) once a test
    has checked them, but those ending in a suffix of `keep`: a test's folder holds only what it still compares
    (FSDPC_KEEP_WORK=1 keeps everything)"""
    if keep_work():
        return
    for exe in exes:
        d, base = os.path.split(os.path.abspath(exe))
        for n in os.listdir(d):
            if (n == base or n.startswith(base + ".")) and not n.endswith(tuple(keep)):
                p = os.path.join(d, n)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p)
                else:
                    os.unlink(p)


def mpirun(world, argv):
    """argv run on `world` ranks; world 1 runs the executable alone (a singleton)."""
    if world == 1:
        return argv
    return ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world)] + argv


def read_metrics(path):
    losses, memory = [], None
    with open(path) as f:
        for line in f:
            o = json.loads(line)
            if "memory" in o:
                memory = o["memory"]
            else:
                losses.append(o["loss"])
    return losses, memory


def onnx_weights(path):
    import onnx
    from onnx import numpy_helper
    m = onnx.load(path)
    return {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}


def rel_err(a, b):
    """norm-wise relative error: max|a-b| / max(max|b|, tiny)"""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def fnv1a64(data):
    h = 14695981039346656037
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return h


def write_manifest(path, records):
    """a checkpoint manifest of these records (its end record's checksum dropped), with a new end record
    carrying the FNV-1a-64 of every byte before it, as runtime/ckpt.c writes it"""
    body = "".join(r + "\n" for r in records if r and not r.startswith("end"))
    with open(path, "w") as f:
        f.write(body + "end %016x\n" % fnv1a64(body.encode()))


def check(cond, msg):
    if not cond:
        raise SystemExit("FAILED: " + msg)


def export_resnet(path, double=False):
    """torchvision's ResNet-18 (10 classes, seed 0) exported in training mode, batch symbolic; in float64 if double"""
    import torch
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    m.train()
    x = torch.zeros(2, 3, 32, 32)
    if double:
        m, x = m.double(), x.double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        torch.onnx.export(m, (x,), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})
