"""--precision fp16: float16 mixed precision with dynamic loss scaling, against PyTorch.

usage: torch_gpt_fp16.py FSDPC WORKDIR

The model and data are torch_gpt.py's (tied GPT, vocab 64, 2 layers, T 16, global
batch 4), compiled with --precision fp16: parameters gathered as float16, every
MatMul on float16 operands with float32 accumulation and result, everything else
float32, float32 master shards, gradient reduction and AdamW; the loss scaled by
S (the backward's seed is S), the gradient unscaled by the update.

1. The recipe.  The oracle is that recipe in PyTorch (torch_gpt_bf16.py's, with
   float16): each step reads the parameters rounded to float16, every matmul,
   forward and backward, rounds both operands to float16 (the backward's dy
   carries the factor S, so it is S*dy that rounds, as in fsdpc) and multiplies
   in float32; the loss's gradient is seeded with S and the float32 masters
   receive it divided by S (GradScaler.unscale_).  At world 1 and 2:
     - the attention is fused, on float16 q, kt, v (torch_gpt_bf16.check_fused);
     - step-1 loss within 1e-6 of the oracle (float16's rounding moves this loss
       by only ~5e-7 from float32's: the gradients tell the dtypes apart);
     - every step-1 gradient (--dump-grads writes it unscaled) within 1e-3 of the
       oracle (||g - ref|| / ||ref||), nearer it than float32 PyTorch's, and
       carrying float16's rounding (torch_gpt_bf16.check_grads: the criterion,
       and the measurement that replaced "2 times closer");
     - all 20 losses within 2e-5 of the oracle, and within 1e-4 of float32
       PyTorch's (fp16 tracks fp32); no step skipped, the scale stays 65536;
     - world 2's losses equal world 1's within 1e-4.
2. Overflow.  At world 2 with --loss-scale-init 2^40 the scaled gradient is far
   beyond float16's range: the first steps are skipped, S halving each time
   (metrics), until it fits; a run of only those skipped steps exports the
   initial weights bit for bit (every rank's shard untouched: all ranks skipped
   together, since the decision is the all-reduced norm's); the first update
   after them is AdamW's first (bias correction of step 1, weight decay 0:
   every moved weight moves by lr within 1e-3 relative, where a count that went
   on through the skips would move it about half as far); the run then trains
   (the loss falls) and S doubles every --loss-scale-growth-interval steps.
3. Checkpoints.  Resuming at world 2 from a checkpoint taken after skips, with
   a growth count under way (--loss-scale-growth-interval 3), continues bit for bit: the later losses, loss scales, skips and the
   exported weights equal the uninterrupted run's.  A manifest of an fp32 run
   without the "updates" record (an older fsdpc's; checksummed again) still
   resumes bit for bit.
4. Strategies.  With --clip-grad-norm 0.05 (active: the clip coefficient and
   1/S fold into one factor) and a fixed --loss-scale 65536, world 4 --shard
   hybrid:2 and world 1 --accum 2 at half the batch follow world 1's run:
   no step skipped, losses and reported norms within 1e-4.  (Where a step
   overflows depends on the per-rank batch -- each rank's gradient is scaled
   before the average, as in PyTorch -- so skips are compared at one world
   size only, in 2.)
"""
import copy
import os
import shutil
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

from common import check, mpirun, onnx_weights, run, write_manifest  # noqa: E402
from gpt import GPT, GPTConfig, export  # noqa: E402
from torch_gpt import EMBD, GLOBAL_B, HEADS, LAYERS, STEPS, T, VOCAB, token_data  # noqa: E402
from torch_gpt_bf16 import check_fused, check_grads, grads_of, recipe  # noqa: E402
from torch_ref import adamw_flags, compile_exe, reference, train_exe  # noqa: E402
import json  # noqa: E402

SCALE = 65536.0


# model.loss(x, y) with the recipe of --precision fp16 (the loss scale fixed at S)
mixed_precision_loss = recipe(torch.float16, SCALE)


def metrics(path):
    with open(path) as f:
        return [o for o in map(json.loads, f) if "step" in o]


def recipe(fsdpc, work, model, onnx_path, tok_path, rank_batches):
    f32_losses, f32_grads = reference(copy.deepcopy(model), lambda m, x, y: m.loss(x, y), rank_batches, 1, STEPS)
    runs = {}
    for world in (1, 2):
        ref_model = copy.deepcopy(model)
        ref_losses, ref_grads = reference(ref_model, mixed_precision_loss, rank_batches, world, STEPS)
        exe = os.path.join(work, "gpt_fp16_w%d" % world)
        check_fused(fsdpc, onnx_path, GLOBAL_B // world, "fp16", "f16")
        compile_exe(fsdpc, onnx_path, exe, GLOBAL_B // world, ["--precision", "fp16"])
        losses, dump = train_exe(exe, world, ["--tokens", tok_path], STEPS, work)
        tag = "fp16 world %d" % world
        m = metrics(exe + ".jsonl")
        check(all(not o["skipped"] and o["loss_scale"] == SCALE for o in m),
              "%s: a step was skipped or the scale moved: %s" % (tag, [(o["loss_scale"], o["skipped"]) for o in m]))
        e1 = abs(losses[0] - ref_losses[0]) / abs(ref_losses[0])
        l32 = abs(losses[0] - f32_losses[0]) / abs(f32_losses[0])
        check(e1 <= 2e-6, "%s: step 1 loss %.9g vs the PyTorch recipe %.9g (rel %.3g), "
              "vs float32 PyTorch %.9g (rel %.3g)" % (tag, losses[0], ref_losses[0], e1, f32_losses[0], l32))
        worst, closest32 = check_grads(tag, grads_of(ref_model, dump), ref_grads, f32_grads, 2e-3, "float16")
        el = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        check(el <= 2e-5, "%s: losses differ from the PyTorch recipe by up to %.3g (rel)" % (tag, el))
        e32 = max(abs(a - b) / abs(b) for a, b in zip(losses, f32_losses))
        check(e32 <= 1e-4, "%s: losses differ from float32 PyTorch's by up to %.3g (rel)" % (tag, e32))
        print("%s: step-1 loss rel %.2g (float32 PyTorch: %.2g), gradients within %.2g of the recipe (worst %s), "
              "at least %.2fx closer than to float32 (%s); %d losses within %.2g of the recipe, %.2g of float32"
              % (tag, e1, l32, worst[0], worst[1], closest32[0], closest32[1], len(losses), el, e32))
        runs[world] = losses
    ew = max(abs(a - b) / abs(b) for a, b in zip(runs[1], runs[2]))
    check(ew <= 1e-4, "fp16: world 2 losses differ from world 1 by up to %.3g (rel)" % ew)
    print("fp16 recipe: world 1 and 2 follow PyTorch; world 1 vs 2 losses within %.2g" % ew)


def train(exe, world, tok_path, steps, tag, extra=()):
    out = exe + "." + tag
    run(mpirun(world, [exe, "--tokens", tok_path, "--steps", str(steps), "--metrics", out + ".jsonl",
                       "--export-onnx", out + ".onnx", "--quiet"] + adamw_flags() + list(extra)), timeout=1800)
    return metrics(out + ".jsonl"), onnx_weights(out + ".onnx")


def overflow(exe, init_w, tok_path):
    lr = 1e-3
    flags = ["--loss-scale-init", str(2.0 ** 40), "--loss-scale-growth-interval", "4", "--weight-decay", "0"]
    m, _ = train(exe, 2, tok_path, 60, "overflow", flags)
    k = 0
    while k < len(m) and m[k]["skipped"]:
        k += 1
    check(1 <= k < 30, "overflow: %d leading skipped steps of %d (expected some, then training)" % (k, len(m)))
    for i in range(k):
        check(m[i]["loss_scale"] == 2.0 ** (40 - i) and m[i]["grad_norm"] is None and m[i]["skipped_total"] == i + 1,
              "overflow: step %d: scale %r (expected 2^%d), grad_norm %r, skipped_total %r"
              % (i + 1, m[i]["loss_scale"], 40 - i, m[i]["grad_norm"], m[i]["skipped_total"]))
    later = [o for o in m[k:] if o["skipped"]]
    s0 = m[k]["loss_scale"]
    grown = [o["loss_scale"] for o in m[k:] if o["loss_scale"] > s0]
    check(len(grown) > 0 or later, "overflow: the scale %g never grew after the skips (growth interval 4)" % s0)
    first, last = np.mean([o["loss"] for o in m[k:k + 3]]), np.mean([o["loss"] for o in m[-3:]])
    check(last < first - 0.1, "overflow: the loss does not fall after the skips (%.4f -> %.4f)" % (first, last))
    # the skipped steps alone: every rank's shard untouched
    _, w_skip = train(exe, 2, tok_path, k, "skipped", flags)
    for name, v in init_w.items():
        check(np.array_equal(w_skip[name], v), "overflow: %s changed over %d skipped steps" % (name, k))
    # one more step: AdamW's first update, bias-corrected as step 1: |dw| = lr |m|/(sqrt(v) + eps) ~ lr
    _, w_one = train(exe, 2, tok_path, k + 1, "first", flags)
    moved = np.concatenate([np.abs(w_one[n].astype(np.float64) - w_skip[n]).ravel() for n in init_w])
    moved = moved[moved > 0]
    top, med = float(moved.max()), float(np.median(moved))
    check(abs(top - lr) <= 1e-3 * lr and abs(med - lr) <= 1e-2 * lr,
          "overflow: the first update after %d skips moves weights by up to %.6g (median %.6g), expected lr %g "
          "(AdamW's step-1 bias correction: the optimizer's count must not advance on skipped steps)"
          % (k, top, med, lr))
    print("overflow (world 2): %d steps skipped on every rank (scale 2^40 -> 2^%d), weights bit-equal across them, "
          "first update |dw| max %.6g median %.6g (lr %g), %d later skips, scale grew to %g, loss %.3f -> %.3f"
          % (k, 40 - k, top, med, lr, len(later), max(o["loss_scale"] for o in m[k:]), first, last))


def resume(fsdpc, exe, exe32, tok_path, work):
    flags = ["--loss-scale-init", str(2.0 ** 24), "--loss-scale-growth-interval", "3"]
    full, w_full = train(exe, 2, tok_path, 14, "full", flags)
    # the checkpoint at step 7 holds skips behind it and a growth count under way (S doubles after step 8)
    check(any(o["skipped"] for o in full[:7]) and
          any(full[i + 1]["loss_scale"] > full[i]["loss_scale"] for i in range(6, 13)),
          "resume: expected skips before step 7 and a growth after it: %s" % [(o["loss_scale"], o["skipped"]) for o in full])
    ck = os.path.join(work, "ckpt16")
    shutil.rmtree(ck, ignore_errors=True)
    train(exe, 2, tok_path, 7, "part", flags + ["--ckpt-dir", ck])
    with open(os.path.join(ck, "step-00000007", "manifest")) as f:
        man = f.read()
    check("\nupdates " in man and "\nloss_scale " in man, "resume: the manifest records no loss scale:\n" + man)
    rest, w_rest = train(exe, 2, tok_path, 14, "rest", flags + ["--resume", ck])
    check(len(rest) == 7, "resume: %d steps after the checkpoint, expected 7" % len(rest))
    for a, b in zip(rest, full[7:]):
        for key in ("loss", "loss_scale", "skipped", "skipped_total", "grad_norm"):
            check(a[key] == b[key], "resume: step %d %s %r, uninterrupted %r" % (a["step"], key, a[key], b[key]))
    for name, v in w_full.items():
        check(np.array_equal(w_rest[name], v), "resume: weight %s differs from the uninterrupted run" % name)
    # an fp32 checkpoint whose manifest lacks the records of this change (an older fsdpc's) resumes bit for bit
    f32, w32 = train(exe32, 2, tok_path, 10, "full")
    ck32 = os.path.join(work, "ckpt32")
    shutil.rmtree(ck32, ignore_errors=True)
    train(exe32, 2, tok_path, 6, "part", ["--ckpt-dir", ck32])
    mp = os.path.join(ck32, "step-00000006", "manifest")
    with open(mp) as f:
        lines = f.read().split("\n")
    check(any(x.startswith("updates ") for x in lines), "resume: the fp32 manifest has no updates record")
    write_manifest(mp, [x for x in lines if not x.startswith("updates ")])  # checksummed again
    rest32, w_rest32 = train(exe32, 2, tok_path, 10, "rest", ["--resume", ck32])
    check([o["loss"] for o in rest32] == [o["loss"] for o in f32[6:]], "resume: fp32 from an old manifest: losses "
          "%s, uninterrupted %s" % ([o["loss"] for o in rest32], [o["loss"] for o in f32[6:]]))
    for name, v in w32.items():
        check(np.array_equal(w_rest32[name], v), "resume: fp32 from an old manifest: weight %s differs" % name)
    print("resume (world 2): fp16 from step 7 (scales %s) equals the uninterrupted run bit for bit; fp32 from a "
          "manifest without 'updates' too" % [o["loss_scale"] for o in full])


def strategies(fsdpc, onnx_path, exe2, tok_path, work):
    flags = ["--clip-grad-norm", "0.05", "--loss-scale", "65536"]
    exe1 = os.path.join(work, "gpt_fp16_w1")
    ref, _ = train(exe1, 1, tok_path, 12, "clip", flags)
    check(not any(o["skipped"] for o in ref) and all(o["grad_norm"] > 0.05 for o in ref),
          "strategies: expected no skips and active clipping: %s" % [(o["loss_scale"], o["grad_norm"]) for o in ref])
    exe_h = os.path.join(work, "gpt_fp16_h2")
    compile_exe(fsdpc, onnx_path, exe_h, GLOBAL_B // 4, ["--precision", "fp16", "--shard", "hybrid:2"])
    exe_a = exe2  # per-rank batch 2: at world 1, --accum 2 is the global batch 4
    worst = 0.0
    for tag, e, world, extra in (("hybrid:2 world 4", exe_h, 4, []), ("accum 2 world 1", exe_a, 1, ["--accum", "2"])):
        got, _ = train(e, world, tok_path, 12, "clip" + str(world), flags + extra)
        check(len(got) == len(ref), "strategies %s: %d steps" % (tag, len(got)))
        worst = max([worst] + [abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(got, ref)] +
                    [abs(a["grad_norm"] - b["grad_norm"]) / b["grad_norm"] for a, b in zip(got, ref)])
        for a, b in zip(got, ref):
            check(a["skipped"] == b["skipped"] and a["loss_scale"] == b["loss_scale"],
                  "strategies %s: step %d skipped %r scale %r, world 1 %r %r"
                  % (tag, a["step"], a["skipped"], a["loss_scale"], b["skipped"], b["loss_scale"]))
            check(abs(a["loss"] - b["loss"]) <= 1e-4 * abs(b["loss"]) and
                  (a["grad_norm"] is None) == (b["grad_norm"] is None) and
                  (a["grad_norm"] is None or abs(a["grad_norm"] - b["grad_norm"]) <= 1e-4 * b["grad_norm"]),
                  "strategies %s: step %d loss %r norm %r, world 1 %r %r"
                  % (tag, a["step"], a["loss"], a["grad_norm"], b["loss"], b["grad_norm"]))
    print("strategies: hybrid:2 at world 4 and --accum 2 follow world 1 under fp16 with clipping (norms %.3g to "
          "%.3g against clip 0.05): losses and norms within %.2g"
          % (min(o["grad_norm"] for o in ref), max(o["grad_norm"] for o in ref), worst))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)
    tok_path, rank_batches = token_data(work)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD, block_size=T,
                          dropout=0.0, tied=True))
    onnx_path = os.path.join(work, "gpt.onnx")
    export(copy.deepcopy(model), onnx_path, GLOBAL_B, T)
    init_w = onnx_weights(onnx_path)

    recipe(fsdpc, work, model, onnx_path, tok_path, rank_batches)
    exe = os.path.join(work, "gpt_fp16_w2")  # built by recipe(): per-rank batch 2
    overflow(exe, init_w, tok_path)
    exe32 = os.path.join(work, "gpt_fp32_w2")
    compile_exe(fsdpc, onnx_path, exe32, GLOBAL_B // 2)
    resume(fsdpc, exe, exe32, tok_path, work)
    strategies(fsdpc, onnx_path, exe, tok_path, work)
    print("OK torch_gpt_fp16")


if __name__ == "__main__":
    main()
