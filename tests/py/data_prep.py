"""scripts/prepare_data.py: a text or a .npy of token ids into llm.c token files that fsdpc trains on.

usage: data_prep.py FSDPC WORKDIR

1. A text (the first 20,000 bytes of Debian's GPL-3, as the demo's corpus): PREFIX_train.bin and
   PREFIX_val.bin have llm.c's header (magic 20240520, version 1, the count), the train tokens then the
   val tokens are the text's bytes in order, val is the last round(0.1 n) of them, and the printed counts
   say so.  --val-fraction 0.25 holds out a quarter.
2. The same bytes as an int64 .npy give byte-identical files; ids up to 70,000 give version 2 (uint32).
3. Refused with exit status 2 and one stderr line: a negative id, a float .npy, --val-fraction 1, a missing
   input, an output that is the input, hf:NAME when the `datasets` package is missing (naming it).  An
   output name that is a planted link is replaced, its target untouched.
4. examples/gpt.onnx compiled for the cpu (batch 2) trains 3 steps on the files: --tokens PREFIX_train.bin
   --val-tokens PREFIX_val.bin --eval-every 1 --eval-steps 1: 3 steps with finite losses and val_loss.
"""
import importlib.util
import json
import math
import os
import shutil
import sys

import numpy as np
from common import check, run

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(ROOT, "scripts", "prepare_data.py")
PY = "/usr/bin/python3"


def read_bin(path):
    """(version, tokens) of an llm.c token file, its header checked"""
    raw = open(path, "rb").read()
    h = np.frombuffer(raw[:1024], "<i4")
    check(h[0] == 20240520 and h[1] in (1, 2), "%s: header %s" % (path, h[:3]))
    t = np.frombuffer(raw[1024:], "<u2" if h[1] == 1 else "<u4")
    check(t.size == h[2], "%s: the header says %d tokens, the file holds %d" % (path, h[2], t.size))
    return int(h[1]), t.astype(np.int64)


def refused(argv, needle, tag):
    p = run([PY, SCRIPT] + argv, check=False)
    err = p.stderr.strip().splitlines()
    check(p.returncode == 2 and len(err) == 1 and needle in err[0],
          "%s: exit %d, stderr %r (expected exit 2, one line with %r)" % (tag, p.returncode, p.stderr, needle))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    text = open("/usr/share/common-licenses/GPL-3", "rb").read()[:20000]
    with open(J("text.txt"), "wb") as f:
        f.write(text)
    b = np.frombuffer(text, np.uint8).astype(np.int64)
    n, n_val = len(text), round(len(text) * 0.1)

    # 1. a text
    p = run([PY, SCRIPT, J("text.txt"), "-o", J("t"), "--seq-len", "64"])
    v1, tr = read_bin(J("t_train.bin"))
    v2, va = read_bin(J("t_val.bin"))
    check(v1 == 1 and v2 == 1, "text: versions %d %d, expected 1 (uint16)" % (v1, v2))
    check(va.size == n_val and np.array_equal(np.concatenate([tr, va]), b),
          "text: train %d + val %d tokens are not the text's %d bytes with the last %d held out"
          % (tr.size, va.size, n, n_val))
    check("train %d tokens" % (n - n_val) in p.stdout and "val   %d tokens" % n_val in p.stdout, "text: " + p.stdout)
    run([PY, SCRIPT, J("text.txt"), "-o", J("q"), "--val-fraction", "0.25"])
    check(read_bin(J("q_val.bin"))[1].size == n // 4, "--val-fraction 0.25")
    print("1. text: %d bytes -> train %d + val %d tokens (llm.c version 1)" % (n, tr.size, va.size))

    # 2. .npy inputs
    np.save(J("ids.npy"), b)
    run([PY, SCRIPT, J("ids.npy"), "-o", J("n")])
    for s in ("train", "val"):
        check(open(J("n_%s.bin" % s), "rb").read() == open(J("t_%s.bin" % s), "rb").read(),
              ".npy: n_%s.bin differs from the text's" % s)
    big = np.arange(0, 70000, 7, dtype=np.uint32)
    np.save(J("big.npy"), big)
    run([PY, SCRIPT, J("big.npy"), "-o", J("g")])
    vg, tg = read_bin(J("g_train.bin"))
    _, tv = read_bin(J("g_val.bin"))
    check(vg == 2 and np.array_equal(np.concatenate([tg, tv]), big), "ids up to 70000: version %d" % vg)
    print("2. .npy: the same files as the text; ids >= 65536: version 2 (uint32)")

    # 3. refused
    np.save(J("neg.npy"), np.array([1, -2, 3]))
    np.save(J("flt.npy"), np.ones(8, np.float32))
    refused([J("neg.npy"), "-o", J("x")], "negative", "a negative id")
    refused([J("flt.npy"), "-o", J("x")], "integers", "a float .npy")
    refused([J("text.txt"), "-o", J("x"), "--val-fraction", "1"], "--val-fraction", "--val-fraction 1")
    refused([J("none.txt"), "-o", J("x")], "none.txt", "a missing input")
    shutil.copy(J("text.txt"), J("same_train.bin"))
    refused([J("same_train.bin"), "-o", J("same")], "is the input", "an output that is the input")
    if importlib.util.find_spec("datasets") is None:
        refused(["hf:some/dataset", "-o", J("x")], "'datasets'", "hf: without the datasets package")
    with open(J("victim"), "wb") as f:
        f.write(b"keep")
    os.symlink(J("victim"), J("l_val.bin"))
    run([PY, SCRIPT, J("text.txt"), "-o", J("l")])
    check(open(J("victim"), "rb").read() == b"keep" and not os.path.islink(J("l_val.bin")),
          "a planted link at l_val.bin was followed")
    print("3. bad inputs refused in one line (exit 2); a planted link replaced, its target untouched")

    # 4. train on them
    exe = J("gpt")
    run([fsdpc, os.path.join(ROOT, "examples", "gpt.onnx"), "-o", exe, "--target", "cpu", "--loss",
         "cross_entropy:logits,labels", "--optimizer", "adamw", "--dim", "batch=2"])
    run([exe, "--tokens", J("t_train.bin"), "--val-tokens", J("t_val.bin"), "--steps", "3", "--eval-every", "1",
         "--eval-steps", "1", "--metrics", J("m.jsonl"), "--quiet"], timeout=300)
    rows = [json.loads(l) for l in open(J("m.jsonl")) if '"step"' in l]
    check([r["step"] for r in rows] == [1, 2, 3], "train: steps %s" % [r["step"] for r in rows])
    check(all(math.isfinite(r["loss"]) and math.isfinite(r["val_loss"]) for r in rows), "train: %s" % rows)
    print("4. examples/gpt.onnx trained 3 steps on them: losses %s, val %s"
          % (" ".join("%.3f" % r["loss"] for r in rows), " ".join("%.3f" % r["val_loss"] for r in rows)))
    print("OK")


if __name__ == "__main__":
    main()
