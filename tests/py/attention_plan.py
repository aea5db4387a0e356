"""--precision bf16 / fp16 fuse the attention as fp32 does: the planned memory of a GPT-2-small shape.

usage: attention_plan.py FSDPC WORKDIR

The model is scripts/shaped_model.py's GPT-2 124M shape (12 layers, d 768, 12 heads, T 1024, vocab 50257) at
batch 8, without weights (--report and --dump-after read none).  For --target cpu and cuda at the default world (2):
  - --dump-after memplan under bf16 and fp16: one FusedAttention and one FusedAttentionGrad per layer, each
    reading q, kt, v in the 16-bit dtype, and no value of B H T T elements (the scores, the probabilities or
    their gradients) anywhere in the plan; the step's FLOPs those of fp32 (codegen/report.c counts the fused
    attention's products whatever its dtype); on cpu no Split of c_attn's output nor Concat of its gradient, the
    attentions reading and writing them in place, rows 3 C apart (passes/pack.c); on cuda both still there;
  - the bf16 and fp16 peaks per rank at most 0.6x fp32's.  Unfused (before 2026-11-26)
    they planned 1.41x fp32's; fused, 0.88x (11.64 GB against 13.16 GB), while a MatMul wrote float32 and
    everything else computed in float32.  Since passes/precision.c stores activations as torch.autocast does
    (products and what is computed from 16-bit values alone in 16 bits; the logits 16-bit and their
    cross-entropy on them; fuse.c's large GEMMs rounding a block of rows at a time): 0.587x (7.73 GB).  Since
    passes/gelu.c makes the GELU one node (its intermediates no longer saved) both peaks fell, fp32's more
    (measured 2026-11-28 against main's build, every target and 16-bit precision alike: fp32 13.11 -> 10.69 GB,
    bf16 7.67 -> 6.46 GB): 0.605x, and the bound was 0.61x for a day.  The 16-bit activations were then already
    0.502x fp32's; what kept the ratio up was the part both plans share, the slots, each the largest unit's size.
    Since memplan.c sizes a slot by the largest unit that takes it (the root unit's gather and flat gradient
    slots are the root's size; the 16-bit plan has one more slot, its gathers being 16-bit): fp32 10.38 GB, bf16
    6.00 GB, 0.578x.
Prints the figures.
"""
import json
import math
import os
import re
import sys

from common import check, run

HERE = os.path.dirname(os.path.abspath(__file__))
LAYERS, HEADS, T, BATCH = 12, 12, 1024, 8


def fsdpc_args(fsdpc, model, target, precision):
    return [fsdpc, model, "--target", target, "--precision", precision, "--loss", "cross_entropy:logits,labels"]


def plan(fsdpc, model, target, precision, work):
    """the planned peak bytes per rank and FLOPs per step of the build (--report-json)"""
    out = os.path.join(work, "%s_%s.json" % (target, precision))
    run(fsdpc_args(fsdpc, model, target, precision) + ["--report", "--report-json", out])
    with open(out) as f:
        r = json.load(f)
    return r["peak_bytes_per_rank"], r["flops_per_step"]


def check_fused(fsdpc, model, target, precision, low):
    """every layer's attention fused on `low` q, kt, v, and no B H T T value planned"""
    out = run(fsdpc_args(fsdpc, model, target, precision) + ["--dump-after", "memplan"]).stdout
    vals = re.findall(r"^  %(\d+) (\w+)\[([\d,]*)\]", out, re.M)
    dtype = {v: dt for v, dt, _ in vals}
    tag = "%s %s" % (target, precision)
    for op, first in (("FusedAttention", 0), ("FusedAttentionGrad", 1)):
        nodes = [re.findall(r"%(\d+)", a) for a in re.findall(r"= %s ([^#]*)#" % op, out)]
        check(len(nodes) == LAYERS, "%s: %d %s nodes, expected %d" % (tag, len(nodes), op, LAYERS))
        check(all(dtype[v] == low for ins in nodes for v in ins[first:first + 3]),
              "%s: a %s whose q, kt, v are not %s" % (tag, op, low))
    # passes/pack.c (cpu only): q, k, v read out of c_attn's packed output, dq, dk, dv written into its gradient
    packs = len(re.findall(r"= (?:Split|Concat) ", out))
    lds = len(re.findall(r"= FusedAttention .*ldq=2304 ldk=2304 ldv=2304", out)) + \
        len(re.findall(r"= FusedAttentionGrad .*ldq=2304 ldk=2304 ldv=2304 lddq=2304 lddk=2304 lddv=2304", out))
    want = (0, 2 * LAYERS) if target == "cpu" else (2 * LAYERS, 0)
    check((packs, lds) == want, "%s: %d Split / Concat nodes and %d attentions reading rows 3 C apart, expected %s"
          % (tag, packs, lds, want))
    scores = BATCH * HEADS * T * T
    planned = re.findall(r"^  %\d+ \w+\[([\d,]*)\].* @(?:arena|slot)", out, re.M)  # (the dropped chain's are not)
    dims = [[int(x) for x in d.split(",") if x] for d in planned]
    big = [d for d in dims if d[-2:] == [T, T] and math.prod(d) >= scores]
    check(not big, "%s: %d values of [.., T, T] with %d elements or more planned (the unfused scores)"
          % (tag, len(big), scores))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    model = os.path.join(work, "gpt2_small.onnx")
    run([sys.executable, os.path.join(HERE, "..", "..", "scripts", "shaped_model.py"), model, "--layers",
         str(LAYERS), "--embd", "768", "--heads", str(HEADS), "--block", str(T), "--batch", str(BATCH), "--vocab",
         "50257", "--no-data"])
    for target in ("cpu", "cuda"):
        p32, f32 = plan(fsdpc, model, target, "fp32", work)
        for precision, low in (("bf16", "bf16"), ("fp16", "f16")):
            check_fused(fsdpc, model, target, precision, low)
            p16, f16 = plan(fsdpc, model, target, precision, work)
            check(f16 == f32, "%s %s: %g FLOPs per step, fp32 %g: the fused attention's count differs"
                  % (target, precision, f16, f32))
            check(p16 <= 0.6 * p32, "%s %s: planned peak %d B, %.3fx fp32's %d B (at most 0.6x)"
                  % (target, precision, p16, p16 / p32, p32))
            print("%s %s: planned peak %.2f GB, %.3fx fp32's %.2f GB; every layer's attention fused"
                  % (target, precision, p16 / 1e9, p16 / p32, p32 / 1e9))
    print("OK attention_plan")


if __name__ == "__main__":
    main()
