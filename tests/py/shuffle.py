"""--shuffle and --seed: every epoch a permutation of the samples, the same at every world size.

usage: shuffle.py FSDPC WORKDIR

Model (float64): y = x * w, loss mse(y, 0) with w = 1 and --lr 0, so a step's loss is the mean of x^2 over
the global batch.  The 12 samples are x_k = 2^k: six times a step's loss is the sum of 4^k over the
samples it read, whose base-4 digits say exactly which samples those were.  The global batch is 6 (per-rank
batch 6, 3, 2 at world 1, 2, 3), so an epoch is 2 steps.  Checked:
- with --shuffle, world 1, 2 and 3 read the same samples in every step; each epoch reads all 12 once;
  the epochs' orders differ, and differ from the unshuffled one (0-5, 6-11);
- --seed 7 twice reads the same; --seed 8 another order;
- without --shuffle the steps read 0-5, 6-11, 0-5, ...;
- a run resumed from a checkpoint written at step 3 (mid-epoch) reads what the uninterrupted run did;
- --seed seeds dropout (a model with Dropout 0.5 in training mode): --seed 0 gives the default masks' losses,
  --seed 5 twice the same ones, --seed 5 and 6 other ones;
- --shuffle=1 and --seed x are one error line each.
"""
import json
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, mpirun, run

N, GB, STEPS = 12, 6, 6


def batches(metrics):
    out = []
    for l in open(metrics):
        o = json.loads(l)
        if "step" not in o:
            continue
        v = int(round(o["loss"] * GB))
        digits = []
        for k in range(N):
            digits += [k] * (v % 4)
            v //= 4
        check(v == 0, "loss %r is not a sum of 4^k" % o["loss"])
        out.append(sorted(digits))
    return out


def random_windows(fsdpc, J):
    """--random-windows: a token stream whose token at position i is i (uint16, 4000 tokens), T = 8; the model
    sums each window's tokens and labels (float64, weight 1, --lr 0), so a sample's output is 2T*s + T^2 for the
    window starting at token s, and a step's mse loss over a global batch of 2 the mean of their squares"""
    T, NT = 8, 4000
    np.arange(NT, dtype="<u2").tofile(J("ramp.bin"))
    n = (NT - 1) // T
    np.save(J("zeros.npy"), np.zeros((n, 1)))
    cast = lambda i, o: helper.make_node("Cast", [i], [o], to=TensorProto.DOUBLE)
    red = lambda i, o: helper.make_node("ReduceSum", [i, "ax"], [o], keepdims=1)
    g = helper.make_graph([cast("idx", "fi"), cast("lab", "fl"), red("fi", "si"), red("fl", "sl"),
                           helper.make_node("Add", ["si", "sl"], ["s"]), helper.make_node("Mul", ["s", "w"], ["y"])],
                          "g", [helper.make_tensor_value_info("idx", TensorProto.INT64, ["batch", T]),
                                helper.make_tensor_value_info("lab", TensorProto.INT64, ["batch", T])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 1])],
                          [numpy_helper.from_array(np.ones(1), "w"), numpy_helper.from_array(np.array([1]), "ax")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J("win.onnx"))

    def windows(world, tag, *extra):
        exe = J("win_w%d" % world)
        if not os.path.exists(exe):
            run([fsdpc, J("win.onnx"), "-o", exe, "--target", "cpu", "--loss", "mse:y,t", "--optimizer", "sgd",
                 "--dim", "batch=%d" % (2 // world)])
        m = J("win_%s.jsonl" % tag)
        run(mpirun(world, [exe, "--tokens", J("ramp.bin"), "--token-inputs", "idx,lab", "--data",
                           "t=" + J("zeros.npy"), "--lr", "0", "--quiet", "--metrics", m] + list(extra)))
        return [json.loads(l)["loss"] for l in open(m) if '"step"' in l]

    def starts(loss):  # the pairs of window starts (a <= b) whose squares average to a step's loss
        two, found = int(round(2 * loss)), []
        for a in range(NT - T):
            yb = two - (2 * T * a + T * T) ** 2
            r = int(round(max(yb, 0) ** 0.5))
            if yb >= 0 and r * r == yb and (r - T * T) % (2 * T) == 0 and a <= (r - T * T) // (2 * T) < NT - T:
                found.append((a, (r - T * T) // (2 * T)))
        return found

    fixed = windows(1, "fixed", "--steps", "3")
    check([starts(l) for l in fixed] == [[(0, 8)], [(16, 24)], [(32, 40)]], "fixed windows: %s" %
          [starts(l) for l in fixed])
    rnd = windows(1, "rnd", "--steps", "8", "--random-windows", "--seed", "4")
    drawn = [starts(l) for l in rnd]
    check(all(len(d) >= 1 for d in drawn), "random windows: a loss no two windows explain: %s" % rnd)
    offs = [s for d in drawn for s in d[0]]
    check(any(s % T for s in offs) and len(set(offs)) > 8, "random windows start at %s: not random offsets" % offs)
    check(windows(2, "rnd_w2", "--steps", "8", "--random-windows", "--seed", "4") == rnd,
          "world 2 draws other windows than world 1")
    check(windows(1, "rnd_again", "--steps", "8", "--random-windows", "--seed", "4") == rnd, "not reproducible")
    check(windows(1, "rnd_seed5", "--steps", "8", "--random-windows", "--seed", "5") != rnd, "--seed 5 draws as 4")
    windows(2, "rnd_ck", "--steps", "8", "--random-windows", "--seed", "4", "--ckpt-dir", J("wck"), "--ckpt-every", "3")
    tail = windows(2, "rnd_resumed", "--steps", "8", "--random-windows", "--seed", "4", "--resume",
                   os.path.join(J("wck"), "step-00000003"))
    check(tail == rnd[3:], "resumed at step 3 draws %s, the whole run %s" % (tail, rnd[3:]))
    print("ok --random-windows: starts %s..., world 1 = 2, reproducible, another seed other windows, resumed "
          "runs continue the draws" % offs[:6])
    p = run([J("win_w1"), "--tokens", J("ramp.bin"), "--token-inputs", "idx,lab", "--data", "t=" + J("zeros.npy"),
             "--random-windows", "--shuffle"], check=False)
    err = p.stderr.strip()
    check(p.returncode == 2 and len(err.splitlines()) == 1 and "give one or the other" in err, "%r" % err)

    # several files as one stream: the ramp cut in three (windows run across the cuts; one file with llm.c's
    # version-1 header) and the targets' .npy in two read as the single files are
    ramp = np.arange(NT, dtype="<u2")
    ramp[:1000].tofile(J("part-0.bin"))
    hdr = np.zeros(256, "<i4")
    hdr[:3] = (20240520, 1, 1500)
    with open(J("part-1.bin"), "wb") as f:
        f.write(hdr.tobytes() + ramp[1000:2500].tobytes())
    ramp[2500:].tofile(J("part-2.bin"))
    zeros = np.load(J("zeros.npy"))
    np.save(J("z-0.npy"), zeros[:100])
    np.save(J("z-1.npy"), zeros[100:])
    for extra in ([], ["--random-windows", "--seed", "4"], ["--shuffle"]):
        one = windows(2, "one" + "".join(extra), "--steps", "8", *extra)
        m = J("win_glob.jsonl")
        run(mpirun(2, [J("win_w2"), "--tokens", J("part-*.bin"), "--token-inputs", "idx,lab", "--data",
                       "t=" + J("z-*.npy"), "--lr", "0", "--quiet", "--metrics", m, "--steps", "8"] + extra))
        glob_losses = [json.loads(l)["loss"] for l in open(m) if '"step"' in l]
        check(glob_losses == one, "%s: the globs read %s, the single files %s" % (extra, glob_losses, one))
    p = run([J("win_w1"), "--tokens", J("part-*.bin"), "--token-inputs", "idx,lab", "--data", "t=" + J("zeros.npy")],
            check=False)
    check("(3 files, read as one stream)" in p.stdout, "no files line: " + p.stdout)
    hdr[1] = 2  # a uint32 file among uint16 ones
    with open(J("part-1.bin"), "wb") as f:
        f.write(hdr.tobytes() + ramp[1000:2500].astype("<u4").tobytes())
    for args, needle in ((["--tokens", J("part-*.bin")], "share a token width"),
                         (["--tokens", J("nothing-*.bin")], "no file matches the pattern")):
        p = run([J("win_w1"), "--token-inputs", "idx,lab", "--data", "t=" + J("zeros.npy")] + args, check=False)
        err = p.stderr.strip()
        check(p.returncode == 1 and len(err.splitlines()) == 1 and needle in err, "%s: %r" % (args, err))
    print("ok globs: three token files (one with llm.c's header) and two .npy read as one stream each, fixed, "
          "random and shuffled windows as the single files; mixed widths and no match one line each")


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 1])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 1])],
                          [numpy_helper.from_array(np.ones(1), "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J("m.onnx"))
    np.save(J("x.npy"), (2.0 ** np.arange(N)).reshape(N, 1))
    np.save(J("t.npy"), np.zeros((N, 1)))
    data = ["--data", "x=" + J("x.npy"), "--data", "t=" + J("t.npy"), "--lr", "0", "--quiet"]

    def train(world, tag, *extra):
        exe = J("train_w%d" % world)
        if not os.path.exists(exe):
            run([fsdpc, J("m.onnx"), "-o", exe, "--target", "cpu", "--loss", "mse:y,t", "--optimizer", "sgd",
                 "--dim", "batch=%d" % (GB // world)])
        metrics = J("%s.jsonl" % tag)
        run(mpirun(world, [exe] + data + ["--metrics", metrics] + list(extra)))
        return batches(metrics)

    want = train(1, "w1", "--steps", str(STEPS), "--shuffle", "--seed", "7")
    for world in (2, 3):
        got = train(world, "w%d" % world, "--steps", str(STEPS), "--shuffle", "--seed", "7")
        check(got == want, "world %d reads %s, world 1 %s" % (world, got, want))
    plain = [list(range(6)), list(range(6, 12))]
    for e in range(STEPS * GB // N):
        check(sorted(want[2 * e] + want[2 * e + 1]) == list(range(N)), "epoch %d reads %s" % (e, want[2 * e:2 * e + 2]))
        check(want[2 * e:2 * e + 2] != plain, "epoch %d is not shuffled: %s" % (e, want[2 * e:2 * e + 2]))
    check(len({tuple(want[2 * e]) for e in range(3)}) > 1, "every epoch reads the same order: %s" % want)
    print("ok --shuffle --seed 7 at worlds 1, 2, 3: the same batches, each epoch all 12 once: %s" % want[:2])
    check(train(1, "again", "--steps", str(STEPS), "--shuffle", "--seed", "7") == want, "--seed 7 not reproducible")
    other = train(1, "seed8", "--steps", str(STEPS), "--shuffle", "--seed", "8")
    check(other != want, "--seed 8 reads what --seed 7 does: %s" % other)
    print("ok --seed 7 again: the same; --seed 8: %s" % other[:2])
    got = train(2, "plain", "--steps", str(STEPS))
    check(got == plain * 3, "without --shuffle: %s" % got)
    print("ok without --shuffle: 0-5, 6-11, ...")
    full = train(2, "ckpt", "--steps", str(STEPS), "--shuffle", "--seed", "3", "--ckpt-dir", J("ck"),
                 "--ckpt-every", "3")
    tail = train(2, "resumed", "--steps", str(STEPS), "--shuffle", "--seed", "3", "--resume",
                 os.path.join(J("ck"), "step-00000003"))
    check(tail == full[3:], "resumed at step 3 reads %s, the whole run %s" % (tail, full[3:]))
    print("ok resumed mid-epoch: steps 4-6 read %s as the uninterrupted run" % tail)
    # --seed seeds dropout too: --seed 0 is the default masks, another seed other masks, reproducibly
    g = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["h"]),
                           helper.make_node("Dropout", ["h", "ratio", "training"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 1])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 1])],
                          [numpy_helper.from_array(np.ones(1), "w"), numpy_helper.from_array(np.array(0.5), "ratio"),
                           numpy_helper.from_array(np.array(True), "training")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J("drop.onnx"))
    run([fsdpc, J("drop.onnx"), "-o", J("drop"), "--target", "cpu", "--loss", "mse:y,t", "--optimizer", "sgd",
         "--dim", "batch=%d" % N])
    losses = {}
    for tag, extra in (("default", []), ("seed0", ["--seed", "0"]), ("seed5", ["--seed", "5"]),
                       ("seed5b", ["--seed", "5"]), ("seed6", ["--seed", "6"])):
        run([J("drop")] + data + ["--steps", "4", "--metrics", J(tag + ".jsonl")] + extra)
        losses[tag] = [json.loads(l)["loss"] for l in open(J(tag + ".jsonl")) if '"step"' in l]
    check(losses["default"] == losses["seed0"] and losses["seed5"] == losses["seed5b"] and
          losses["seed5"] != losses["default"] and losses["seed6"] != losses["seed5"], "dropout losses %s" % losses)
    print("ok --seed seeds dropout: 0 is the default masks, 5 twice the same, 5 and 6 differ")
    random_windows(fsdpc, J)
    for flag, needle in ((["--shuffle=1"], "--shuffle takes no value"), (["--seed", "x"], "--seed"),
                         (["--random-windows"], "--random-windows draws the windows of --tokens"),
                         (["--random-windows=1"], "--random-windows takes no value")):
        p = run([J("train_w1")] + data + flag, check=False)
        err = p.stderr.strip()
        check(p.returncode == 2 and len(err.splitlines()) == 1 and needle in err, "%s: %d %r" % (flag, p.returncode,
                                                                                             err))
    print("OK shuffle")


if __name__ == "__main__":
    main()
