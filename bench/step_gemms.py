"""The GEMMs one training step of bench's GPT makes: read from the step fsdpc generates (bench/gemm_libs.py,
bench/bf16_gemm.py)."""
import collections
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def step_gemms(fsdpc, work, d, L, T, B, sfx="f32", flags=()):
    """Counter {(batch, sa, sb, m, n, k, ta, tb, alpha): calls} of the k_matmul[_add]_<sfx> calls of one training
    step of the d/L/T/B GPT (vocab 256), compiled with fsdpc's extra flags"""
    sys.path.insert(0, os.path.join(HERE, "..", "examples"))
    import torch
    from gpt import GPT, GPTConfig, export
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, n_layer=L, n_head=max(1, d // 64), n_embd=d, block_size=T))
    onnx = os.path.join(work, "gpt.onnx")
    export(model, onnx, B=B, T=T)
    subprocess.run([fsdpc, onnx, "-o", os.path.join(work, "train"), "--target", "cpu", "--loss",
                    "cross_entropy:logits,labels", "--dim", "batch=%d" % B, "--emit-c"] + list(flags), check=True,
                   stdout=subprocess.DEVNULL)
    call = re.compile(r"k_matmul(_add)?_%s\((.*)\);" % sfx)
    shapes = collections.Counter()
    for line in open(os.path.join(work, "train.c")):
        m = call.search(line)
        if not m:
            continue
        a = [v.strip() for v in m.group(2).split(",")]
        # k_matmul: c, a, b, batch, sa, sb, m, n, k, ta, tb, beta; k_matmul_add: c, a, b, bias, add, alpha, batch, ...
        alpha = float(a[-9]) if m.group(1) else 1.0
        tail = a[-8:] if m.group(1) else a[-9:-1]
        shapes[tuple(int(v) for v in tail) + (alpha,)] += 1
    if not shapes:
        raise SystemExit("bench: no k_matmul_%s calls in %s" % (sfx, os.path.join(work, "train.c")))
    return shapes
