"""--precision bf16 trains the GPT as PyTorch does with the same mixed precision.

usage: torch_gpt_bf16.py FSDPC WORKDIR

The model and data are torch_gpt.py's (tied GPT, vocab 64, 2 layers, T 16, global
batch 4).  fsdpc compiles it with --precision bf16: parameters gathered as
bfloat16, every MatMul on bfloat16 operands with float32 accumulation and a
float32 result, everything else float32, float32 master weights, gradient
reduction and AdamW.  The oracle is that recipe written in PyTorch: each step
reads the parameters rounded to bfloat16 (gradients pass straight through the
rounding to the float32 masters), and every matmul, forward and backward,
rounds its two operands to bfloat16 and multiplies in float32.

Checks at world 1 and 2:
  - the attention is fused (one FusedAttention and its gradient per layer, on
    bfloat16 q, kt, v: flash attention's roundings, which are the unfused
    MatMuls' here, as the head size 16 makes the scale 1/4 exact);
  - step-1 loss within 1e-5 of the oracle, and at least 10 times closer to it
    than to plain float32 PyTorch's: it is really bfloat16;
  - every step-1 gradient within 5e-3 of the oracle (||g - ref|| / ||ref||), and
    computed in bfloat16: check_grads() says how that is told, and why it is
    not "N times closer to the oracle than to float32";
  - all 20 losses within 1e-4 of the oracle;
  - the run is world-invariant: world 2's losses equal world 1's within 1e-4.
"""
import copy
import os
import re
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

from common import check, run  # noqa: E402
from gpt import GPT, GPTConfig, export  # noqa: E402
from torch_gpt import EMBD, GLOBAL_B, HEADS, LAYERS, STEPS, T, VOCAB, token_data  # noqa: E402
from torch_ref import compile_exe, reference, safe_name, train_exe  # noqa: E402


def recipe(dtype, scale=1.0):
    """the loss function of --precision bf16 (dtype torch.bfloat16) or fp16 (torch.float16, loss scale S =
    scale) as PyTorch computes it: every parameter read rounded to dtype, every matmul on dtype-rounded
    operands in float32, and so their backward; with a loss scale the loss's gradient is S, and each
    parameter's gradient is divided by S where it is read"""
    def rnd(x):
        return x.to(dtype).to(torch.float32)

    class Round(torch.autograd.Function):
        """a float32 master read in dtype"""
        @staticmethod
        def forward(ctx, x):
            return rnd(x)

        @staticmethod
        def backward(ctx, dy):
            return dy / scale

    class Seed(torch.autograd.Function):
        """the loss, whose gradient is S instead of 1"""
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, dy):
            return dy * scale

    class MatMul16(torch.autograd.Function):
        """a @ b on dtype-rounded operands in float32, and so its backward"""
        @staticmethod
        def forward(ctx, a, b):
            a, b = rnd(a), rnd(b)
            ctx.save_for_backward(a, b)
            return torch.matmul(a, b)

        @staticmethod
        def backward(ctx, dy):
            a, b = ctx.saved_tensors
            dy = rnd(dy)
            da = torch.matmul(dy, b.transpose(-2, -1))
            db = torch.matmul(a.transpose(-2, -1), dy)
            # undo broadcasting of a shared operand (x @ W with x batched)
            while db.dim() > b.dim():
                db = db.sum(0)
            while da.dim() > a.dim():
                da = da.sum(0)
            return da, db

    def loss(model, x, y):
        params = dict(model.named_parameters())
        rounded = {n: Round.apply(p) for n, p in params.items()}
        # tied weights: every name of a parameter reads the same rounded tensor
        for name, t in model.state_dict(keep_vars=True).items():
            for n, p in params.items():
                if t is p:
                    rounded[name] = rounded[n]
        matmul, linear = torch.Tensor.__matmul__, F.linear
        torch.Tensor.__matmul__ = lambda a, b: MatMul16.apply(a, b)
        F.linear = lambda x, w, b=None: MatMul16.apply(x, w.t()) + (b if b is not None else 0)
        try:
            with torch.nn.utils.stateless._reparametrize_module(model, rounded):
                return Seed.apply(model.loss(x, y))
        finally:
            torch.Tensor.__matmul__, F.linear = matmul, linear
    return loss


mixed_precision_loss = recipe(torch.bfloat16)  # model.loss(x, y) with the recipe of --precision bf16


def check_grads(tag, got, ref_grads, f32_grads, tol, dtype):
    """Every parameter's step-1 gradient g against the recipe's r and float32 PyTorch's f (distances
    ||a - b|| / ||b||, fro_err):
      (a) |g - r| <= tol: g follows the recipe;
      (b) |g - f| >= |r - f| / 2: g carries the low-precision rounding, at the size the recipe's own has
          (a float32 path through any parameter gives |g - f| ~ 1e-6, a thousandth of it);
      (c) |g - r| < |g - f|: g is nearer the recipe than float32.
    Why not "at least 2x nearer the recipe than float32", which this test asked until 2026-11: that ratio
    is not a property of a correct recipe.  Rounding to 16 bits is discontinuous, so where two correct
    implementations' float32 sums differ in the last bit an operand rounds to the neighbouring 16-bit
    value, and the first layers' gradients collect those flips.  How many there are depends on the
    summation order of every float32 op -- which OpenBLAS kernel the CPU gets included.  Measured with
    one fsdpc --precision fp16 executable on one machine (2026-11-24, Intel Xeon with AVX-512):
    OPENBLAS_CORETYPE=Haswell gives a worst ratio of 2.75, SkylakeX (the default there) 1.85 (at
    transformer.h.0.ln_1.weight: |g - r| 3.55e-4, |g - f| 6.56e-4); the gradients were bit-identical
    to those of the fsdpc before the fold/fuse rewrites (fee2b4c).  Two correct float16 recipes in
    PyTorch that differ only in summing the matmuls in float64 instead of float32 are 1.3e-4 to 2.0e-4
    apart on that layer, a third of |r - f|.  (b) and (c) held there with margins of 1.8x (b: worst
    |g - f| / |r - f| = 0.91 fp16, 0.95 bf16) and 1.85x (c)."""
    worst, closest32 = (0.0, ""), (float("inf"), "")
    for name, g in got.items():
        e, e32 = fro_err(g, ref_grads[name]), fro_err(g, f32_grads[name])
        d = fro_err(ref_grads[name], f32_grads[name])
        worst = max(worst, (e, name))
        closest32 = min(closest32, (e32 / max(e, 1e-12), name))
        check(e <= tol, "%s: gradient of %s differs from the PyTorch recipe by %.3g" % (tag, name, e))
        check(e32 >= 0.5 * d, "%s: gradient of %s is within %.3g of float32 PyTorch's, where the %s recipe is %.3g "
              "away from it: is it really computed in %s?" % (tag, name, e32, dtype, d, dtype))
        check(e < e32, "%s: gradient of %s is nearer float32 PyTorch's (%.3g) than the %s recipe's (%.3g)"
              % (tag, name, e32, dtype, e))
    return worst, closest32


def check_fused(fsdpc, onnx_path, batch, precision, low):
    """--precision `precision` fuses every layer's attention (passes/attention.c): after the precision pass
    there are LAYERS FusedAttention and LAYERS FusedAttentionGrad nodes, each reading q, kt, v in the dtype
    `low` (bf16, f16) and nothing else in it, and no Softmax is left"""
    out = run([fsdpc, onnx_path, "--dump-after", "precision", "--target", "cpu", "--loss",
               "cross_entropy:logits,labels", "--dim", "batch=%d" % batch, "--precision", precision]).stdout
    dtype = dict(re.findall(r"^  %(\d+) (\w+)\[", out, re.M))
    for op, first in (("FusedAttention", 0), ("FusedAttentionGrad", 1)):
        nodes = [re.findall(r"%(\d+)", args) for args in re.findall(r"= %s ([^#]*)#" % op, out)]
        check(len(nodes) == LAYERS, "%s: %d %s nodes after precision, expected %d (one per layer)"
              % (precision, len(nodes), op, LAYERS))
        for ins in nodes:
            got = [dtype[v] for v in ins]
            want = [low if first <= j < first + 3 else "f32" for j in range(len(ins))]
            check(got == want, "%s: %s reads %s, expected %s" % (precision, op, got, want))
    check(" Softmax " not in out, "%s: a Softmax is left after precision" % precision)


def fro_err(a, b):
    """||a - b|| / ||b||: rounding flips are sparse, bfloat16 rounding everywhere is not"""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def grads_of(model, dump):
    sd = model.state_dict(keep_vars=True)
    files = set(os.listdir(dump))
    out = {}
    for name, p in model.named_parameters():
        hits = [k for k, v in sd.items() if v is p and safe_name(k) in files]
        check(len(hits) == 1, "parameter %s: %d gradient files in %s" % (name, len(hits), dump))
        out[name] = np.load(os.path.join(dump, safe_name(hits[0])))
    return out


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
    f32_losses, f32_grads = reference(copy.deepcopy(model), lambda m, x, y: m.loss(x, y), rank_batches, 1, 1)

    runs = {}
    for world in (1, 2):
        ref_model = copy.deepcopy(model)
        ref_losses, ref_grads = reference(ref_model, mixed_precision_loss, rank_batches, world, STEPS)
        exe = os.path.join(work, "gpt_bf16_w%d" % world)
        check_fused(fsdpc, onnx_path, GLOBAL_B // world, "bf16", "bf16")
        compile_exe(fsdpc, onnx_path, exe, GLOBAL_B // world, ["--precision", "bf16"])
        losses, dump = train_exe(exe, world, ["--tokens", tok_path], STEPS, work)
        tag = "bf16 world %d" % world
        e1 = abs(losses[0] - ref_losses[0]) / abs(ref_losses[0])
        l32 = abs(losses[0] - f32_losses[0]) / abs(f32_losses[0])
        check(e1 <= 1e-5 and l32 >= 10 * e1, "%s: step 1 loss %.9g vs the PyTorch recipe %.9g (rel %.3g), "
              "vs float32 PyTorch %.9g (rel %.3g)" % (tag, losses[0], ref_losses[0], e1, f32_losses[0], l32))
        worst, closest32 = check_grads(tag, grads_of(ref_model, dump), ref_grads, f32_grads, 5e-3, "bfloat16")
        el = max(abs(a - b) / abs(b) for a, b in zip(losses, ref_losses))
        check(el <= 1e-4, "%s: losses differ from the PyTorch recipe by up to %.3g (rel)" % (tag, el))
        print("%s: step-1 loss rel %.2g (float32 PyTorch: %.2g), gradients within %.2g of the recipe (worst %s), at least %.0fx "
              "closer than to float32 (%s); %d losses within %.2g"
              % (tag, e1, l32, worst[0], worst[1], closest32[0], closest32[1], len(losses), el))
        runs[world] = losses
    ew = max(abs(a - b) / abs(b) for a, b in zip(runs[1], runs[2]))
    check(ew <= 1e-4, "bf16: world 2 losses differ from world 1 by up to %.3g (rel)" % ew)
    print("OK torch_gpt_bf16: world 1 and 2 follow the PyTorch bf16 recipe; world 1 vs 2 losses within %.2g" % ew)


if __name__ == "__main__":
    main()
