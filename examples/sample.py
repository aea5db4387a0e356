"""Sample text from a trained byte-level GPT through fsdpc's forward-only executable.

    python3 examples/sample.py EVAL_EXE WORKDIR [--prompt TEXT] [--chars 200] [--temp 0.8] [--seed 0]

EVAL_EXE was built with `fsdpc trained.onnx -o EVAL_EXE --target cpu --eval --dim batch=1`: it reads
input_ids [1, T] and writes logits [1, T, 256].  Each new byte is drawn from the
logits at the last position of the window of the last T bytes (left-padded with
spaces), with temperature TEMP.  Needs only NumPy.
"""
import argparse
import os
import subprocess

import numpy as np

ap = argparse.ArgumentParser()
ap.add_argument("exe")
ap.add_argument("work")
ap.add_argument("--prompt", default="The ")
ap.add_argument("--chars", type=int, default=200)
ap.add_argument("--temp", type=float, default=0.8)
ap.add_argument("--block", type=int, default=64)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
os.makedirs(a.work, exist_ok=True)
rng = np.random.default_rng(a.seed)
text = list(a.prompt.encode())
inp, out = os.path.join(a.work, "ids.npy"), os.path.join(a.work, "out")
for _ in range(a.chars):
    window = ([32] * a.block + text)[-a.block:]
    np.save(inp, np.array([window], dtype=np.int64))
    subprocess.run([a.exe, "--input", "input_ids=" + inp, "--out-dir", out, "--quiet"], check=True)
    logits = np.load(os.path.join(out, "logits.npy"))[0, -1].astype(np.float64) / a.temp
    p = np.exp(logits - logits.max())
    text.append(int(rng.choice(256, p=p / p.sum())))
print(bytes(text).decode("utf-8", errors="replace"))
