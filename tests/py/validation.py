"""Validation during training: --val-data / --val-tokens, --eval-every, --eval-steps, --save-best.

usage: validation.py FSDPC WORKDIR

Checked:
- the value: a GPT (examples/gpt.py, 2 layers, d 32, T 16) with dropout 0.1, trained at --lr 0 (AdamW leaves
  every weight as it is) under --shard full --wrap blocks at world 1 and 2: every val_loss equals PyTorch's
  eval-mode cross-entropy of the initial model over the same validation batches (rel 1e-5): Dropout is off,
  the batches are the set's first ones, world 1 and 2 agree; without dropout, it equals the cross-entropy of
  the logits an --eval build of the model computes on those batches;
- the weights it reads: the GPT without dropout, its training set one global batch (every step reads it)
  and the validation set the same batch: the val_loss after step k equals step k+1's training loss (rel
  1e-6), for an AdamW run with --lr 1e-2 at world 2 under --shard full, grad_op, none, --precision bf16
  and --accum 2;
- nothing else touched: the GPT with dropout 0.1, --lr 1e-3, world 2, with validation after every step
  and without: every training loss and exported weight bit-identical (no optimizer state, data position or
  dropout mask moves);
- BatchNorm on its running statistics: ResNet-18 (torchvision, BatchNorm in training mode), world 1, --lr 0,
  2 steps: val_loss equals PyTorch's eval-mode loss after two training-mode forwards of the same batches
  (which moved the running statistics), rel 1e-4;
- when: --eval-every 2 over 5 steps validates after steps 2, 4 and 5 (the last); metrics carry val_loss,
  val_time_ms and val_best only there; the step line says "val loss" and the summary the best;
- --save-best: --ckpt-dir DIR/best holds one checkpoint, of the step with the lowest val_loss, and
  --resume DIR/best continues after it;
- bad use is one line, exit 2 (or 1 for a data file): --eval-every without validation data, --save-best
  without --ckpt-dir, --val-data naming no input, a --val-tokens file too short (named as --val-tokens).
"""
import copy
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from common import check, export_resnet, mpirun, onnx_weights, run  # noqa: E402

V, T, GB = 64, 16, 8


def metrics(path):
    return [json.loads(l) for l in open(path) if '"step"' in l]


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def gpt_val_ref(model, tokens, nbatch):
    """PyTorch's eval-mode mean cross-entropy over the first nbatch global batches of a token stream"""
    import torch
    m = copy.deepcopy(model).eval()
    losses = []
    with torch.no_grad():
        for k in range(nbatch):
            w = np.stack([tokens[(k * GB + s) * T:(k * GB + s) * T + T + 1] for s in range(GB)]).astype(np.int64)
            x, y = torch.from_numpy(w[:, :T]), torch.from_numpy(w[:, 1:])
            losses.append(float(m.loss(x, y)))
    return float(np.mean(losses))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    import torch
    from gpt import GPT, GPTConfig, export
    models = {}
    for name, p in (("gpt", 0.0), ("gpt_drop", 0.1)):
        torch.manual_seed(0)
        models[name] = GPT(GPTConfig(vocab_size=V, n_layer=2, n_head=2, n_embd=32, block_size=T, dropout=p,
                                     tied=True))
        export(copy.deepcopy(models[name]), J(name + ".onnx"), 4, T)
    rng = np.random.default_rng(0)
    train_tok = rng.integers(0, V, T * GB * 6 + 1).astype("<u2")
    val_tok = rng.integers(0, V, T * GB * 3 + 1).astype("<u2")
    train_tok.tofile(J("train.bin"))
    val_tok.tofile(J("val.bin"))
    gpt = ["--target", "cpu", "--loss", "cross_entropy:logits,labels", "--wrap", "blocks"]

    def build(model, world, tag, extra=()):
        exe = J("%s_w%d" % (tag, world))
        run([fsdpc, J(model + ".onnx"), "-o", exe, "--verify", "--dim", "batch=%d" % (GB // world)] + gpt +
            list(extra))
        return exe

    # 1. the value: PyTorch's eval-mode loss at the initial weights (lr 0), world 1 and 2, dropout off
    want = gpt_val_ref(models["gpt_drop"], val_tok, 2)
    got = {}
    for world in (1, 2):
        exe = build("gpt_drop", world, "drop")
        p = run(mpirun(world, [exe, "--tokens", J("train.bin"), "--val-tokens", J("val.bin"), "--lr", "0",
                               "--steps", "5", "--eval-every", "2", "--eval-steps", "2",
                               "--metrics", exe + ".jsonl"]))
        ms = metrics(exe + ".jsonl")
        val_steps = [o["step"] for o in ms if "val_loss" in o]
        check(val_steps == [2, 4, 5], "world %d: validated after steps %s, expected 2, 4, 5" % (world, val_steps))
        for o in ms:
            if "val_loss" in o:
                check(rel(o["val_loss"], want) < 1e-5, "world %d step %d: val_loss %.9g, PyTorch eval %.9g"
                      % (world, o["step"], o["val_loss"], want))
                check(o["val_time_ms"] > 0 and isinstance(o["val_best"], bool), "world %d: val fields %s" % (world, o))
            else:
                check("val_time_ms" not in o and "val_best" not in o, "step %d has val fields" % o["step"])
        check([o["val_best"] for o in ms if "val_loss" in o][0], "the first validation is not the best")
        lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
        check(sum("val loss" in l for l in lines) == 3, "step lines with 'val loss':\n%s" % "\n".join(lines))
        check("validation: 2 batches of 8 samples (24 in the set)" in p.stdout, "no validation line:\n" + p.stdout)
        check("best val loss" in p.stdout.splitlines()[-1], "summary: " + p.stdout.splitlines()[-1])
        got[world] = [o["val_loss"] for o in ms if "val_loss" in o]
        print("gpt dropout 0.1, lr 0, world %d: val_loss %.9g, PyTorch eval %.9g" % (world, got[world][0], want))
    check(all(rel(a, b) < 1e-6 for a, b in zip(got[1], got[2])), "world 1 %s vs 2 %s" % (got[1], got[2]))

    # the same as fsdpc's own forward-only build: the GPT without dropout at lr 0, its val_loss against the
    # cross-entropy of an --eval executable's logits on the same two batches
    exe = build("gpt", 2, "evalref")
    run(mpirun(2, [exe, "--tokens", J("train.bin"), "--val-tokens", J("val.bin"), "--lr", "0", "--steps", "1",
                   "--eval-steps", "2", "--quiet", "--metrics", exe + ".jsonl"]))
    val = metrics(exe + ".jsonl")[0]["val_loss"]
    run([fsdpc, J("gpt.onnx"), "-o", J("fwd"), "--target", "cpu", "--eval", "--dim", "batch=%d" % GB])
    ces = []
    for k in range(2):
        w = np.stack([val_tok[(k * GB + s) * T:(k * GB + s) * T + T + 1] for s in range(GB)]).astype(np.int64)
        np.save(J("ids.npy"), w[:, :T])
        run([J("fwd"), "--input", "input_ids=" + J("ids.npy"), "--out-dir", J("fwd_out")])
        z = np.load(J("fwd_out", "logits.npy")).astype(np.float64)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        ces.append(-np.take_along_axis(logp, w[:, 1:, None], -1).mean())
    check(rel(val, float(np.mean(ces))) < 1e-5, "val_loss %.9g, the --eval build's %.9g" % (val, np.mean(ces)))
    print("gpt, lr 0, world 2: val_loss %.9g = the cross-entropy of an --eval build's logits %.9g"
          % (val, np.mean(ces)))

    # 2. the current weights: train = val = one global batch; val after step k = training loss of step k+1,
    # under every strategy, bf16 and gradient accumulation (each micro-step reads the same batch)
    one = train_tok[:T * GB + 1]
    one.tofile(J("one.bin"))
    for tag, extra, run_extra in (("full", [], []), ("grad_op", ["--shard", "grad_op"], []),
                                  ("none", ["--shard", "none"], []), ("bf16", ["--precision", "bf16"], []),
                                  ("accum2", [], ["--accum", "2", "--eval-steps", "2"])):
        exe = build("gpt", 2, "one_" + tag, extra)
        run(mpirun(2, [exe, "--tokens", J("one.bin"), "--val-tokens", J("one.bin"), "--lr", "1e-2", "--steps",
                       "6", "--eval-every", "1", "--quiet", "--metrics", exe + ".jsonl"] + run_extra))
        ms = metrics(exe + ".jsonl")
        for a, b in zip(ms, ms[1:]):
            check(rel(a["val_loss"], b["loss"]) < 1e-6, "%s: val_loss after step %d %.9g, loss of step %d %.9g"
                  % (tag, a["step"], a["val_loss"], b["step"], b["loss"]))
        check(ms[-1]["loss"] < ms[0]["loss"] - 0.1, "%s: the one-batch GPT did not learn: %s"
              % (tag, [o["loss"] for o in ms]))
        print("gpt one batch, world 2, %-7s: val_loss after step k = loss of step k+1 (%s)"
              % (tag, ", ".join("%.6f" % o["val_loss"] for o in ms[:-1])))

    # 3. nothing else touched: training with and without validation, bit for bit
    exe = build("gpt_drop", 2, "touch")
    res = []
    for tag, extra in (("plain", []), ("val", ["--val-tokens", J("val.bin"), "--eval-every", "1"])):
        out = exe + "_" + tag
        run(mpirun(2, [exe, "--tokens", J("train.bin"), "--lr", "1e-3", "--steps", "5", "--quiet",
                       "--metrics", out + ".jsonl", "--export-onnx", out + ".onnx"] + extra))
        res.append(([o["loss"] for o in metrics(out + ".jsonl")], onnx_weights(out + ".onnx")))
    (l0, w0), (l1, w1) = res
    check(l0 == l1, "training losses with validation %s differ from without %s" % (l1, l0))
    for k in w0:
        check(np.array_equal(w0[k], w1[k]), "exported %s differs with validation" % k)
    print("gpt dropout 0.1, world 2: losses and weights bit-identical with and without validation")

    # 4. BatchNorm: ResNet-18 at lr 0; its running statistics moved by two training forwards
    export_resnet(J("resnet.onnx"))
    xs = rng.standard_normal((8, 3, 32, 32)).astype(np.float32)
    ys = rng.integers(0, 10, 8).astype(np.int64)
    np.save(J("rx.npy"), xs[:4]), np.save(J("ry.npy"), ys[:4])
    np.save(J("vx.npy"), xs[4:]), np.save(J("vy.npy"), ys[4:])
    exe = J("resnet")
    run([fsdpc, J("resnet.onnx"), "-o", exe, "--target", "cpu", "--dim", "batch=2", "--loss",
         "cross_entropy:logits,labels"])
    run([exe, "--data", "x=" + J("rx.npy"), "--data", "labels=" + J("ry.npy"), "--val-data", "x=" + J("vx.npy"),
         "--val-data", "labels=" + J("vy.npy"), "--lr", "0", "--steps", "2", "--quiet", "--metrics", exe + ".jsonl"])
    import torchvision
    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10)
    # the export's running statistics: its trace ran the forward once in training mode
    sd = m.state_dict()
    for k, v in onnx_weights(J("resnet.onnx")).items():
        if k in sd:
            sd[k] = torch.from_numpy(v.copy())
    m.load_state_dict(sd)
    m.train()
    with torch.no_grad():
        for k in range(2):  # two steps of batch 2 over the 4 training samples
            m(torch.from_numpy(xs[2 * k:2 * k + 2]))
        m.eval()
        want = np.mean([float(torch.nn.functional.cross_entropy(m(torch.from_numpy(xs[4 + 2 * k:6 + 2 * k])),
                                                                torch.from_numpy(ys[4 + 2 * k:6 + 2 * k])))
                        for k in range(2)])
    got = metrics(exe + ".jsonl")[-1]["val_loss"]
    check(rel(got, want) < 1e-4, "resnet18: val_loss %.9g, PyTorch eval %.9g" % (got, want))
    print("resnet18, BatchNorm on running statistics: val_loss %.9g, PyTorch eval %.9g" % (got, want))

    # 5. --save-best: one checkpoint, the lowest val_loss's; --resume continues after it
    exe = build("gpt", 1, "best")
    ck = J("ck")
    # one batch learnt at a high rate: the loss on it jumps, then falls below its first value, then wobbles
    run([exe, "--tokens", J("one.bin"), "--val-tokens", J("one.bin"), "--lr", "0.3", "--steps", "10",
         "--eval-every", "1", "--save-best", "--ckpt-dir", ck, "--quiet", "--metrics", exe + ".jsonl"])
    ms = metrics(exe + ".jsonl")
    vals = [o["val_loss"] for o in ms]
    best = ms[int(np.argmin(vals))]["step"]
    steps = sorted(d for d in os.listdir(os.path.join(ck, "best")) if d.startswith("step-"))
    check(steps == ["step-%08d" % best], "best/ holds %s; the lowest val_loss is step %d's (%s)" % (steps, best, vals))
    check(open(os.path.join(ck, "best", "latest")).read().strip() == "step-%08d" % best, "best/latest")
    check([o["step"] for o in ms if o["val_best"]][-1] == best, "val_best flags")
    check(sum(o["val_best"] for o in ms) >= 2, "the best changed only once: %s" % vals)
    p = run([exe, "--tokens", J("one.bin"), "--resume", os.path.join(ck, "best"), "--steps", str(best + 1)])
    check("resumed from %s at step %d" % (os.path.join(ck, "best"), best) in p.stdout, "resume:\n" + p.stdout)
    print("--save-best: best/ holds step %d (val %s), resumed from it" % (best, ", ".join("%.4f" % v for v in vals)))

    # 6. bad use
    (val_tok[:T]).tofile(J("short.bin"))
    for args, code, needles in (
            (["--eval-every", "2"], 2, ["--eval-every validates on held-out data", "--val-data"]),
            (["--val-tokens", J("val.bin"), "--save-best"], 2, ["--save-best", "--ckpt-dir"]),
            (["--val-tokens", J("val.bin"), "--val-data", "nope=" + J("vx.npy")], 1, ["--val-data nope",
                                                                                      "no input 'nope'"]),
            (["--val-tokens", J("short.bin")], 1, ["--val-tokens " + J("short.bin"), "tokens"])):
        p = run([exe, "--tokens", J("train.bin"), "--steps", "1"] + args, check=False)
        err = p.stderr.strip().splitlines()
        check(p.returncode == code and len(err) == 1 and all(n in err[0] for n in needles),
              "%s: exit %d, stderr %s" % (args, p.returncode, err))
    print("bad use: one line each")
    print("OK validation")


if __name__ == "__main__":
    main()
