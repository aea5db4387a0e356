"""fsdpc's CPU training step against PyTorch's on the same GPT, single process, the same threads.

    /usr/bin/python3 bench/gpt_cpu.py [--threads 2] [--steps 6] [--repeat 3] [--fsdpc build/fsdpc]
                                      [--torch2 PYTHON] [--no-compile] [--ort PYTHON|none]
                                      [--sizes 128/4/128/8,...]

The driver runs under Debian's /usr/bin/python3 (torch 1.13 exports the ONNX file fsdpc compiles).  The sides,
each a process of its own on the same model, initial weights, batch and optimizer (AdamW, lr 1e-4), with every
thread count set explicitly to --threads (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS,
torch.set_num_threads):
  fsdpc             the executable fsdpc builds (--target cpu), as a user runs it;
  torch 1.13        Debian's PyTorch, eager (bench/torch_step.py under /usr/bin/python3);
  torch 2 eager     PyTorch 2 from PyPI (bench/torch_step.py under --torch2: default the python3 on PATH when it
                    has torch >= 2, else a virtual environment the script makes once, and says so, in
                    ~/.cache/fsdpc-bench/torch2 (bench/torch2.py); none: the column is left out);
  torch 2 compile   the same with torch.compile (its compilation is in the warm-up step, not timed);
  ORT-training      ONNX Runtime Training (onnxruntime-training-cpu) on the fsdpc side's ONNX file
                    (bench/ort_step.py under --ort: default a virtual environment the script makes once, and says
                    so, in ~/.cache/fsdpc-bench/ort).
Interleaved: each repetition runs every side once per size, in turn.  A side's time is the median of its timed
steps (after one warm-up); the table gives the best and the median of those over the repetitions, fsdpc's ratio
to each side (best against best: below 1 is faster), GFLOP/s and the share of this machine's sgemm peak
(2048^3, measured here with --threads), and peak RSS.  Training FLOPs per token: 6 N + 12 L T d.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--torch2", default="", help="a python with torch >= 2 (default: python3 on PATH if it has it, else one "
                "installed in ~/.cache/fsdpc-bench/torch2; none: leave PyTorch 2 out)")
ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
ap.add_argument("--ort", default="", help="a python with onnxruntime-training (default: make a virtual environment "
                "in ~/.cache/fsdpc-bench/ort on the torch 2 python; none: leave ONNX Runtime Training out)")
ap.add_argument("--sizes", default="128/4/128/8,256/6/256/8,512/8/256/8", help="d/L/T/B,...")
args = ap.parse_args()
for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[k] = str(args.threads)  # before numpy/torch load their BLAS

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch2 import ensure_debian_torch, torch2_python  # noqa: E402

ensure_debian_torch()
import numpy as np  # noqa: E402

import gpt_work  # noqa: E402


def ort_python(py2):
    """a python with onnxruntime-training-cpu: --ort, or a virtual environment made once (it needs torch: onnxruntime's
    training module imports it, so the environment sees the torch 2 python's packages; onnx < 1.17: ORT 1.19 reads
    IR version 10 at most)"""
    if args.ort == "none":
        return None
    if args.ort:
        return args.ort
    if not py2:
        print("note: ONNX Runtime Training needs a python with torch >= 2 (--torch2): its column is left out")
        return None
    venv = os.path.join(os.path.expanduser("~"), ".cache", "fsdpc-bench", "ort")
    py = os.path.join(venv, "bin", "python")
    ok = os.path.exists(py) and subprocess.run([py, "-c", "import onnxruntime.training.api"],
                                               capture_output=True).returncode == 0
    if not ok:
        print("installing ONNX Runtime Training: %s -m venv --system-site-packages %s; pip install "
              "onnxruntime-training-cpu 'onnx<1.17'" % (py2, venv), flush=True)
        subprocess.run([py2, "-m", "venv", "--system-site-packages", venv], check=True)
        subprocess.run([py, "-m", "pip", "install", "-q", "onnxruntime-training-cpu", "onnx<1.17"], check=True)
    return py


def sgemm_peak():
    a = np.random.rand(2048, 2048).astype(np.float32)
    a @ a
    best = 1e9
    for _ in range(3):
        t = time.perf_counter()
        a @ a
        best = min(best, time.perf_counter() - t)
    return 2 * 2048 ** 3 / best / 1e9


def torch_side(py, work, mode):
    o = gpt_work.run_torch(py, work, mode, args.threads, args.steps)
    return statistics.median(o["times_ms"][1:]), o["peak_rss"]


def ort_side(py, work):
    p = subprocess.run([py, os.path.join(HERE, "ort_step.py"), work, str(args.threads), str(args.steps)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit("%s ort_step.py failed:\n%s" % (py, p.stderr[-3000:]))
    o = json.loads(p.stdout.strip().splitlines()[-1])
    return statistics.median(o["times_ms"][1:]), o["peak_rss_bytes"]


def fsdpc_side(work):
    o = gpt_work.run_fsdpc(work, "train", args.steps + 1, args.threads)
    return statistics.median(o["times_ms"][1:]), o["peak_rss"]


def main():
    py2, v2 = torch2_python(args.torch2)
    sides = ["fsdpc", "torch 1.13"]
    if py2:
        sides += ["torch %s eager" % v2] + ([] if args.no_compile else ["torch %s compile" % v2])
    else:
        print("note: --torch2 none: the PyTorch 2 columns are left out")
    pyo = ort_python(py2)
    if pyo:
        sides.append("ORT-training")
    peak = sgemm_peak()
    print("threads %d, sgemm 2048^3 peak %.1f GFLOP/s (numpy, %s threads), %d timed steps after 1 warm-up, %d "
          "interleaved repetitions" % (args.threads, peak, args.threads, args.steps, args.repeat))
    sizes = gpt_work.parse_sizes(args.sizes)
    root = tempfile.mkdtemp(prefix="fsdpc-bench-")
    res = {}
    try:
        for d, L, T, B in sizes:
            work = os.path.join(root, "%d_%d_%d_%d" % (d, L, T, B))
            params = gpt_work.prepare(work, d, L, T, B)
            gpt_work.build(args.fsdpc, work, "train", B)
            res[(d, L, T, B)] = {s: [] for s in sides}
            res[(d, L, T, B)]["params"] = params
        for rep in range(args.repeat):
            for key in sizes:
                work = os.path.join(root, "%d_%d_%d_%d" % key)
                for s in sides:
                    if s == "fsdpc":
                        r = fsdpc_side(work)
                    elif s == "ORT-training":
                        r = ort_side(pyo, work)
                    elif s == "torch 1.13":
                        r = torch_side(sys.executable, work, "eager")
                    else:
                        r = torch_side(py2, work, "compile" if s.endswith("compile") else "eager")
                    res[key][s].append(r)
                print("  repetition %d, %s: %s" % (rep + 1, "/".join(map(str, key)), ", ".join(
                    "%s %.1f ms" % (s, res[key][s][-1][0]) for s in sides)), flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    head = "| d/L/T/B | params | " + " | ".join("%s ms best (median)" % s for s in sides) + " | " + \
        " | ".join("fsdpc / %s" % s for s in sides[1:]) + " | fsdpc GFLOP/s | % of sgemm peak | peak RSS " + \
        " / ".join(sides) + " |"
    print(head)
    print("|" + " --- |" * (head.count("|") - 1))
    for key in sizes:
        d, L, T, B = key
        r = res[key]
        best = {s: min(t for t, _ in r[s]) for s in sides}
        med = {s: statistics.median(t for t, _ in r[s]) for s in sides}
        rss = {s: max(m for _, m in r[s]) for s in sides}
        gfs = (6 * r["params"] + 12 * L * T * d) * B * T / (best["fsdpc"] / 1e3) / 1e9
        print("| %d/%d/%d/%d | %.2f M | %s | %s | %.1f | %.0f %% | %s |" % (
            d, L, T, B, r["params"] / 1e6, " | ".join("%.1f (%.1f)" % (best[s], med[s]) for s in sides),
            " | ".join("%.2f" % (best["fsdpc"] / best[s]) for s in sides[1:]), gfs, 100 * gfs / peak,
            " / ".join("%.0f MB" % (rss[s] / 1e6) for s in sides)))


if __name__ == "__main__":
    main()
