"""Write a nanoGPT-shaped decoder-only transformer as ONNX, its weights as external data: models of any size for
planning (fsdpc --report) and for compiling without reading the weights.  Needs only onnx and numpy (no torch);
runs with onnx 1.12 and 1.23.

usage: /usr/bin/python3 scripts/shaped_model.py OUT.onnx [--layers L] [--embd D] [--heads H] [--block T]
           [--batch B] [--vocab V] [--ffn F] [--head-dim K] [--untied] [--gelu erf|op]
           [--no-data | --data random|sparse] [--seed S]

    --layers 12 --embd 768 --heads 12 --block 1024 --vocab 50257            GPT-2 124M (the defaults)
    --layers 48 --embd 1600 --heads 25 --block 1024 --vocab 50257           GPT-2 XL 1.5B
    --layers 96 --embd 12288 --heads 96 --block 2048 --vocab 50257 --no-data   GPT-3 175B, for planning
    --layers 48 --embd 1024 --heads 128 --head-dim 128 --ffn 65536 --vocab 32128 --untied --no-data
                                                                 T5-11B's 24 + 24 blocks as one decoder stack
                                                                 (no cross-attention: 9.7 B of its 11.3 B)

then, e.g.

    fsdpc OUT.onnx --report --world 512 --target cuda --precision bf16 --wrap blocks --recompute units \\
          --loss cross_entropy:logits,labels
    fsdpc OUT.onnx -o train --target cpu --loss cross_entropy:logits,labels      (needs --data)

The graph is the one examples/gpt.py exports through torch.onnx (so fsdpc's fold, attention and fuse passes treat
both alike), with static shapes: input_ids [B, T] int64 → logits [B, T, V].  Token and position embeddings
(Gather of transformer.wte.weight [V, D] and transformer.wpe.weight [T, D] at Range(0, T)), L pre-LayerNorm
blocks transformer.h.<i>: ln_1; attn.c_attn (one Linear [3A, D] giving q, k, v, Split; A = H hd, hd = --head-dim,
default D / H), heads by Reshape and Transpose (k as [B, H, hd, T]), scores q·k scaled by Mul(1/sqrt(hd)), the causal mask as Where(mask == 0, -inf,
scores) with one float buffer causal_mask [1, 1, T, T] (tril of ones) shared by the blocks, Softmax, the second
MatMul, attn.c_proj [D, A]; ln_2; mlp.c_fc [F, D] (F = --ffn, default 4D), GELU (erf form, or the Gelu op of
opset 20 with --gelu op),
mlp.c_proj; residual Adds), transformer.ln_f, and lm_head: MatMul by wte transposed (tied, the default) or by
lm_head.weight [V, D] (--untied).  Linear weights are [out, in] and used through Transpose, as torch exports them.
Every initializer is external data at a 64-byte aligned offset of one file, OUT.onnx.data (named by its bare file
name, beside the model):

    --no-data        (the default) the file is not written: the model alone, for --report and --dump-after
    --data sparse    the file is made by truncate, so it holds zeros and costs no disk I/O however large; only
                     the mask is written (tril of ones): a model of any size for compiling with -o
    --data random    real values, initialised as nanoGPT (normal(0, 0.02), c_proj normal(0, 0.02/sqrt(2L)),
                     zero biases, LayerNorm weights 1), from --seed (default 0)

The script prints the parameter count (the mask excluded) and the data file's size.
"""
import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper

ALIGN = 64


def params(layers, embd, block, vocab, untied, ffn=None, inner=None):
    """[(name, shape, init)] of the trained initializers, in graph order; init: 'w', 'proj', 'zero', 'one'.
    ffn: the MLP's width (default 4 embd); inner: the attention's heads x head dim (default embd)."""
    D, F, A = embd, ffn or 4 * embd, inner or embd
    p = [("transformer.wte.weight", [vocab, D], "w"), ("transformer.wpe.weight", [block, D], "w")]
    for i in range(layers):
        h = "transformer.h.%d." % i
        p += [(h + "ln_1.weight", [D], "one"), (h + "ln_1.bias", [D], "zero"),
              (h + "attn.c_attn.weight", [3 * A, D], "w"), (h + "attn.c_attn.bias", [3 * A], "zero"),
              (h + "attn.c_proj.weight", [D, A], "proj"), (h + "attn.c_proj.bias", [D], "zero"),
              (h + "ln_2.weight", [D], "one"), (h + "ln_2.bias", [D], "zero"),
              (h + "mlp.c_fc.weight", [F, D], "w"), (h + "mlp.c_fc.bias", [F], "zero"),
              (h + "mlp.c_proj.weight", [D, F], "proj"), (h + "mlp.c_proj.bias", [D], "zero")]
    p += [("transformer.ln_f.weight", [D], "one"), ("transformer.ln_f.bias", [D], "zero")]
    if untied:
        p += [("lm_head.weight", [vocab, D], "w")]
    return p


def param_count(layers, embd, block, vocab, untied=False, ffn=None, inner=None):
    """The number of trained parameters (what fsdpc --report counts)."""
    return sum(int(np.prod(s)) for _, s, _ in params(layers, embd, block, vocab, untied, ffn, inner))


class Graph:
    def __init__(self):
        self.nodes, self.n = [], 0

    def op(self, op_type, inputs, name, nout=1, **attrs):
        """a node named NAME_<n>; its output (outputs NAME_<n>_<k> when nout > 1)"""
        self.n += 1
        node = "%s_%d" % (name, self.n)
        outs = [node] if nout == 1 else ["%s_%d" % (node, k) for k in range(nout)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=node, **attrs))
        return outs[0] if nout == 1 else outs

    def const(self, name, array):
        self.n += 1
        out = "%s_%d" % (name, self.n)
        t = helper.make_tensor(out, {np.dtype(np.int64): TensorProto.INT64, np.dtype(np.float32): TensorProto.FLOAT}[
            array.dtype], list(array.shape), array.flatten().tolist())
        self.nodes.append(helper.make_node("Constant", [], [out], name=out, value=t))
        return out

    def linear(self, x, prefix):
        wt = self.op("Transpose", [prefix + ".weight"], prefix + "/Transpose", perm=[1, 0])
        y = self.op("MatMul", [x, wt], prefix + "/MatMul")
        return self.op("Add", [prefix + ".bias", y], prefix + "/Add")

    def layernorm(self, x, prefix):
        return self.op("LayerNormalization", [x, prefix + ".weight", prefix + ".bias"], prefix + "/LayerNorm",
                       axis=-1, epsilon=1e-5)


def build(a):
    B, T, D, H, V = a.batch, a.block, a.embd, a.heads, a.vocab
    hd = a.head_dim or D // H
    A = H * hd
    g = Graph()
    f32 = lambda v: np.array(v, dtype=np.float32)
    i64 = lambda v: np.array(v, dtype=np.int64)
    pos = g.op("Range", [g.const("pos_start", i64(0)), g.const("pos_limit", i64(T)), g.const("pos_delta", i64(1))],
               "/Range")
    x = g.op("Add", [g.op("Gather", ["transformer.wte.weight", "input_ids"], "/wte/Gather"),
                     g.op("Gather", ["transformer.wpe.weight", pos], "/wpe/Gather")], "/Add")
    masked = g.op("Equal", ["causal_mask", g.const("/mask_zero", f32(0.0))], "/Equal")
    heads = g.const("/heads_shape", i64([B, T, H, hd]))
    merged = g.const("/merged_shape", i64([B, T, A]))
    for i in range(a.layers):
        p = "transformer.h.%d." % i
        s = "/h.%d/" % i
        qkv = g.linear(g.layernorm(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = g.op("Split", [qkv, g.const(s + "attn/split", i64([A, A, A]))], s + "attn/Split", nout=3, axis=2)
        q = g.op("Transpose", [g.op("Reshape", [q, heads], s + "attn/Reshape")], s + "attn/Transpose", perm=[0, 2, 1, 3])
        kt = g.op("Transpose", [g.op("Reshape", [k, heads], s + "attn/Reshape")], s + "attn/Transpose",
                  perm=[0, 2, 3, 1])
        v = g.op("Transpose", [g.op("Reshape", [v, heads], s + "attn/Reshape")], s + "attn/Transpose", perm=[0, 2, 1, 3])
        att = g.op("Mul", [g.op("MatMul", [q, kt], s + "attn/MatMul"), g.const(s + "attn/scale", f32(1 / math.sqrt(hd)))],
                   s + "attn/Mul")
        att = g.op("Where", [masked, g.const(s + "attn/neg_inf", f32(-np.inf)), att], s + "attn/Where")
        y = g.op("MatMul", [g.op("Softmax", [att], s + "attn/Softmax", axis=-1), v], s + "attn/MatMul")
        y = g.op("Reshape", [g.op("Transpose", [y], s + "attn/Transpose", perm=[0, 2, 1, 3]), merged], s + "attn/Reshape")
        x = g.op("Add", [x, g.linear(y, p + "attn.c_proj")], s + "Add")
        h = g.linear(g.layernorm(x, p + "ln_2"), p + "mlp.c_fc")
        if a.gelu == "op":
            h = g.op("Gelu", [h], s + "mlp/gelu/Gelu")
        else:
            e = g.op("Erf", [g.op("Div", [h, g.const(s + "mlp/gelu/sqrt2", f32(math.sqrt(2)))], s + "mlp/gelu/Div")],
                     s + "mlp/gelu/Erf")
            e = g.op("Add", [e, g.const(s + "mlp/gelu/one", f32(1.0))], s + "mlp/gelu/Add")
            h = g.op("Mul", [g.op("Mul", [h, e], s + "mlp/gelu/Mul"), g.const(s + "mlp/gelu/half", f32(0.5))],
                     s + "mlp/gelu/Mul")
        x = g.op("Add", [x, g.linear(h, p + "mlp.c_proj")], s + "Add")
    x = g.layernorm(x, "transformer.ln_f")
    head = "lm_head.weight" if a.untied else "transformer.wte.weight"
    g.nodes.append(helper.make_node("MatMul", [x, g.op("Transpose", [head], "/lm_head/Transpose", perm=[1, 0])],
                                    ["logits"], name="/lm_head/MatMul"))
    return g


def external(name, shape, location, offset):
    t = TensorProto()
    t.name, t.data_type = name, TensorProto.FLOAT
    t.dims.extend(shape)
    t.data_location = TensorProto.EXTERNAL
    nbytes = 4 * int(np.prod(shape))
    for k, v in (("location", location), ("offset", str(offset)), ("length", str(nbytes))):
        e = t.external_data.add()
        e.key, e.value = k, v
    return t, nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--embd", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--block", type=int, default=1024, help="T, the sequence length")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--ffn", type=int, default=0, help="the MLP's width (default 4 x --embd)")
    ap.add_argument("--head-dim", type=int, default=0, help="each head's width (default --embd / --heads)")
    ap.add_argument("--untied", action="store_true", help="lm_head gets its own weight")
    ap.add_argument("--gelu", choices=["erf", "op"], default="erf")
    ap.add_argument("--no-data", action="store_true", help="do not write the data file (the default)")
    ap.add_argument("--data", choices=["random", "sparse"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    if a.no_data and a.data:
        ap.error("--no-data and --data exclude each other")
    if min(a.layers, a.embd, a.heads, a.block, a.batch, a.vocab) < 1 or min(a.ffn, a.head_dim) < 0:
        ap.error("every size must be positive")
    if not a.head_dim and a.embd % a.heads:
        ap.error("--embd must be a multiple of --heads (or give --head-dim)")
    inner = a.heads * a.head_dim if a.head_dim else None
    T = a.block
    data_name = os.path.basename(a.out) + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(a.out)), data_name)
    inits, layout, off = [], [], 0
    for name, shape, kind in params(a.layers, a.embd, T, a.vocab, a.untied, a.ffn or None, inner) + [
            ("causal_mask", [1, 1, T, T], "mask")]:
        t, nbytes = external(name, shape, data_name, off)
        inits.append(t)
        layout.append((off, shape, kind))
        off = (off + nbytes + ALIGN - 1) // ALIGN * ALIGN
    g = build(a)
    graph = helper.make_graph(g.nodes, "shaped_gpt", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [a.batch, T])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [a.batch, T, a.vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20 if a.gelu == "op" else 17)],
                              producer_name="fsdpc scripts/shaped_model.py")
    model.ir_version = 9 if a.gelu == "op" else 8
    with open(a.out, "wb") as f:  # not onnx.save: it would look for the tensors' data
        f.write(model.SerializeToString())
    if a.data:
        rng = np.random.default_rng(a.seed)
        with open(data_path, "wb") as f:
            f.truncate(off)
            for o, shape, kind in layout:
                if kind == "mask":
                    x = np.tril(np.ones((T, T), np.float32))
                elif a.data == "sparse" or kind == "zero":
                    continue
                elif kind == "one":
                    x = np.ones(shape, np.float32)
                else:
                    std = 0.02 / math.sqrt(2 * a.layers) if kind == "proj" else 0.02
                    x = (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
                f.seek(o)
                f.write(x.tobytes())
    elif os.path.exists(data_path):
        print("note: %s exists and is left as it is (the model names it)" % data_path, file=sys.stderr)
    print("%s: %d parameters, %d nodes, data %s (%d bytes)" % (
        a.out, param_count(a.layers, a.embd, T, a.vocab, a.untied, a.ffn or None, inner), len(g.nodes),
        data_path if a.data else "not written", off))


if __name__ == "__main__":
    main()
