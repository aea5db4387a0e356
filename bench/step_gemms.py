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
    return read_gemms(os.path.join(work, "train.c"), sfx)


def read_gemms(path, sfx="f32"):
    """Counter {(batch, sa, sb, m, n, k, ta, tb, alpha): calls} of the k_matmul[_add]_<sfx> calls of the step in
    path (fsdpc's --emit-c)"""
    # each GEMM node opens a block with its descriptor (runtime/rt.h's RtGemm), its call on the next line:
    #   { static const RtGemm gm = {.batch = 1, .stride_a = 0, ..., .alpha = 1, .beta = 0};
    #     k_matmul_add_f32(t_y, t_a, t_b, t_bias, NULL, gm.alpha, RT_GEMM(gm)); }
    desc = re.compile(r"static const RtGemm gm = \{(.*)\};")
    call = re.compile(r"\bk_matmul(_add)?_%s\(" % sfx)
    shapes = collections.Counter()
    lines = open(path).read().split("\n")
    for i, line in enumerate(lines):
        m = desc.search(line)
        if not m:
            continue
        f = dict((k.strip().lstrip("."), v.strip()) for k, v in (kv.split("=") for kv in m.group(1).split(",")))
        c = next((call.search(l) for l in lines[i + 1:i + 8] if "k_matmul" in l), None)
        if not c:
            continue
        alpha = float(f["alpha"]) if c.group(1) else 1.0
        shapes[tuple(int(f[k]) for k in ("batch", "stride_a", "stride_b", "m", "n", "k", "trans_a", "trans_b"))
               + (alpha,)] += 1
    if not shapes:
        raise SystemExit("bench: no k_matmul_%s calls in %s" % (sfx, path))
    return shapes
