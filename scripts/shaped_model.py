"""Write a decoder-only transformer of a given shape as ONNX, its weights as external data: models of any size for
planning (fsdpc --report) and for compiling without reading the weights.  GPT-2's block by default; Llama's and
MPT's by flags.  Needs only onnx and numpy (no torch); runs with onnx 1.12 and 1.23.

usage: /usr/bin/python3 scripts/shaped_model.py OUT.onnx [--layers L] [--embd D] [--heads H] [--block T]
           [--batch B] [--vocab V] [--ffn F] [--head-dim K] [--untied] [--gelu erf|op]
           [--norm layer|rms] [--mlp gelu|swiglu] [--pos learned|rotary|none] [--kv-heads G] [--no-bias]
           [--no-data | --data random|sparse] [--seed S]

    --layers 12 --embd 768 --heads 12 --block 1024 --vocab 50257            GPT-2 124M (the defaults)
    --layers 48 --embd 1600 --heads 25 --block 1024 --vocab 50257           GPT-2 XL 1.5B
    --layers 96 --embd 12288 --heads 96 --block 2048 --vocab 50257 --no-data   GPT-3 175B, for planning
    --layers 48 --embd 1024 --heads 128 --head-dim 128 --ffn 65536 --vocab 32128 --untied --no-data
                                                                 T5-11B's 24 + 24 blocks as one decoder stack
                                                                 (no cross-attention: 9.7 B of its 11.3 B)
    --layers 32 --embd 4096 --heads 32 --ffn 11008 --vocab 32000 --block 4096 --norm rms --mlp swiglu
          --pos rotary --no-bias --untied                                   Llama 2 7B (6.74 B)
    --layers 80 --embd 8192 --heads 64 --kv-heads 8 --ffn 28672 --vocab 32000 --block 4096 --norm rms
          --mlp swiglu --pos rotary --no-bias --untied                      Llama 2 70B (69.0 B)
    --layers 32 --embd 4096 --heads 32 --vocab 50368 --pos none --no-bias   MPT-7B as released (ALiBi's bias
                                                                 costs no GEMM FLOPs: --pos none has its FLOPs)

then, e.g.

    fsdpc OUT.onnx --report --world 512 --target cuda --precision bf16 --wrap blocks --recompute units \\
          --loss cross_entropy:logits,labels
    fsdpc OUT.onnx -o train --target cpu --loss cross_entropy:logits,labels      (needs --data)

The graph is the one examples/gpt.py exports through torch.onnx (so fsdpc's fold, attention and fuse passes treat
both alike), with static shapes: input_ids [B, T] int64 -> logits [B, T, V].  Token embeddings (Gather of
transformer.wte.weight [V, D]), plus (--pos learned, the default) position embeddings transformer.wpe.weight [T, D]
at Range(0, T); L pre-norm blocks transformer.h.<i>: ln_1; the attention: attn.c_attn (one Linear [3A, D] giving
q, k, v, Split; A = H hd, hd = --head-dim, default D / H), or with --kv-heads G < H (grouped-query attention)
attn.q_proj [A, D], attn.k_proj and attn.v_proj [G hd, D]; heads by Reshape and Transpose (k as [B, H, hd, T]);
--pos rotary rotates q and k as Llama's apply_rotary_pos_emb (x cos + rotate_half(x) sin, rotate_half by Slice, Neg
and Concat, the cos and sin tables [T, hd] Constants of theta 10000); grouped K and V repeated to H heads as
transformers' repeat_kv (Unsqueeze, Expand, Reshape); scores q.k scaled by Mul(1/sqrt(hd)), the causal mask as
Where(causal_mask, -inf, scores) with one bool initializer causal_mask [1, 1, T, T] (true above the diagonal: the
masked keys) shared by the blocks, inside the model so that fsdpc reads it without the data file and computes the
causal band (--mask buffer: nanoGPT's Where(mask == 0, -inf, scores) of a float buffer causal_mask, tril of ones, in
the data file; a plan without that file keeps the mask as a tensor and charges the masked half), Softmax, the second MatMul, attn.c_proj [D, A]; ln_2; the MLP: mlp.c_fc [F, D] (F = --ffn, default 4D), GELU (erf
form, or the Gelu op of opset 20 with --gelu op), mlp.c_proj [D, F]; or --mlp swiglu: mlp.gate_proj and
mlp.up_proj [F, D], c_proj(silu(gate x) * up x) with silu as x Sigmoid(x); residual Adds), transformer.ln_f, and
lm_head: MatMul by wte transposed (tied, the default) or by lm_head.weight [V, D] (--untied).  The norms are
LayerNormalization with weight and bias, or --norm rms: x / Sqrt(ReduceMean(x x) + 1e-5) * weight (no bias).
Every Linear has a bias unless --no-bias.  Linear weights are [out, in] and used through Transpose, as torch
exports them.  Every float initializer is external data at a 64-byte aligned offset of one file, OUT.onnx.data
(named by its bare file name, beside the model):

    --no-data        (the default) the file is not written: the model alone, for --report and --dump-after
    --data sparse    the file is made by truncate, so it holds zeros and costs no disk I/O however large; only
                     a --mask buffer is written (tril of ones): a model of any size for compiling with -o
    --data random    real values, initialised as nanoGPT (normal(0, 0.02), c_proj normal(0, 0.02/sqrt(2L)),
                     zero biases, norm weights 1), from --seed (default 0)

The script prints the parameter count (the mask excluded) and the data file's size.
"""
import argparse
import math
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ALIGN = 64


class Arch:
    """The block's kind (the flags --norm, --mlp, --pos, --kv-heads, --no-bias): GPT-2's by default."""

    def __init__(self, norm="layer", mlp="gelu", pos="learned", kv_heads=0, bias=True):
        self.norm, self.mlp, self.pos, self.kv_heads, self.bias = norm, mlp, pos, kv_heads, bias


GPT2 = Arch()


def params(layers, embd, block, vocab, untied, ffn=None, inner=None, arch=GPT2, heads=1):
    """[(name, shape, init)] of the trained initializers, in graph order; init: 'w', 'proj', 'zero', 'one'.
    ffn: the MLP's width (default 4 embd); inner: the attention's heads x head dim (default embd); arch: the block's
    kind; heads: the query heads (only grouped-query attention, arch.kv_heads, reads it: K and V are
    kv_heads x head dim wide)."""
    D, F, A = embd, ffn or 4 * embd, inner or embd
    KV = A // heads * arch.kv_heads if arch.kv_heads else A

    def linear(name, out, inp, init="w"):
        return [(name + ".weight", [out, inp], init)] + ([(name + ".bias", [out], "zero")] if arch.bias else [])

    def norm(name):
        return [(name + ".weight", [D], "one")] + ([(name + ".bias", [D], "zero")] if arch.norm == "layer" else [])

    p = [("transformer.wte.weight", [vocab, D], "w")]
    if arch.pos == "learned":
        p += [("transformer.wpe.weight", [block, D], "w")]
    for i in range(layers):
        h = "transformer.h.%d." % i
        p += norm(h + "ln_1")
        if KV == A:
            p += linear(h + "attn.c_attn", 3 * A, D)
        else:
            p += linear(h + "attn.q_proj", A, D) + linear(h + "attn.k_proj", KV, D) + linear(h + "attn.v_proj", KV, D)
        p += linear(h + "attn.c_proj", D, A, "proj") + norm(h + "ln_2")
        if arch.mlp == "swiglu":
            p += linear(h + "mlp.gate_proj", F, D) + linear(h + "mlp.up_proj", F, D)
        else:
            p += linear(h + "mlp.c_fc", F, D)
        p += linear(h + "mlp.c_proj", D, F, "proj")
    p += norm("transformer.ln_f")
    if untied:
        p += [("lm_head.weight", [vocab, D], "w")]
    return p


def param_count(layers, embd, block, vocab, untied=False, ffn=None, inner=None, arch=GPT2, heads=1):
    """The number of trained parameters (what fsdpc --report counts)."""
    return sum(int(np.prod(s)) for _, s, _ in params(layers, embd, block, vocab, untied, ffn, inner, arch, heads))


class Graph:
    def __init__(self, opset):
        self.nodes, self.n, self.opset = [], 0, opset

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
            array.dtype], list(array.shape), array.tobytes(), raw=True)
        self.nodes.append(helper.make_node("Constant", [], [out], name=out, value=t))
        return out

    def linear(self, x, prefix, bias=True):
        wt = self.op("Transpose", [prefix + ".weight"], prefix + "/Transpose", perm=[1, 0])
        y = self.op("MatMul", [x, wt], prefix + "/MatMul")
        return self.op("Add", [prefix + ".bias", y], prefix + "/Add") if bias else y

    def norm(self, x, prefix, kind):
        """LayerNorm (weight and bias), or RMSNorm as torch writes it: x / sqrt(mean(x^2) + eps) * weight"""
        if kind == "layer":
            return self.op("LayerNormalization", [x, prefix + ".weight", prefix + ".bias"], prefix + "/LayerNorm",
                           axis=-1, epsilon=1e-5)
        sq = self.op("Mul", [x, x], prefix + "/Mul")
        if self.opset >= 18:  # axes became an input
            ms = self.op("ReduceMean", [sq, self.const(prefix + "/axes", np.array([-1], np.int64))],
                         prefix + "/ReduceMean", keepdims=1)
        else:
            ms = self.op("ReduceMean", [sq], prefix + "/ReduceMean", axes=[-1], keepdims=1)
        rms = self.op("Sqrt", [self.op("Add", [ms, self.const(prefix + "/eps", np.array(1e-5, np.float32))],
                                       prefix + "/Add")], prefix + "/Sqrt")
        return self.op("Mul", [self.op("Div", [x, rms], prefix + "/Div"), prefix + ".weight"], prefix + "/Mul")

    def rotary(self, x, cos, sin, hd, prefix):
        """x [B, h, T, hd] rotated as Llama's apply_rotary_pos_emb: x cos + rotate_half(x) sin"""
        i64 = lambda v: self.const(prefix + "/idx", np.array(v, dtype=np.int64))
        lo = self.op("Slice", [x, i64([0]), i64([hd // 2]), i64([-1])], prefix + "/Slice")
        hi = self.op("Slice", [x, i64([hd // 2]), i64([hd]), i64([-1])], prefix + "/Slice")
        rot = self.op("Concat", [self.op("Neg", [hi], prefix + "/Neg"), lo], prefix + "/Concat", axis=-1)
        return self.op("Add", [self.op("Mul", [x, cos], prefix + "/Mul"), self.op("Mul", [rot, sin], prefix + "/Mul")],
                       prefix + "/Add")

    def repeat_kv(self, x, B, KH, rep, T, hd, prefix):
        """x [B, KH, T, hd] -> [B, KH rep, T, hd], each K/V head repeated rep times (transformers' repeat_kv)"""
        i64 = lambda v: self.const(prefix + "/shape", np.array(v, dtype=np.int64))
        u = self.op("Unsqueeze", [x, i64([2])], prefix + "/Unsqueeze")
        e = self.op("Expand", [u, i64([B, KH, rep, T, hd])], prefix + "/Expand")
        return self.op("Reshape", [e, i64([B, KH * rep, T, hd])], prefix + "/Reshape")


def rope_tables(T, hd, theta=10000.0):
    """cos and sin [T, hd] of rotary embeddings (Llama's: frequencies theta^(-2i/hd), the halves repeated)"""
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    f = np.outer(np.arange(T, dtype=np.float64), inv)
    f = np.concatenate([f, f], axis=-1)
    return np.cos(f).astype(np.float32), np.sin(f).astype(np.float32)


def opset_of(a):
    """the model's opset: 20 for the Gelu op, else 17"""
    return 20 if a.gelu == "op" else 17


def arch_of(a):
    return Arch(a.norm, a.mlp, a.pos, a.kv_heads, not a.no_bias)


def attention(g, x, p, s, a, masked, rope):
    """one block's attention on x [B, T, D]: its output [B, T, D] before the residual Add"""
    B, T, H = a.batch, a.block, a.heads
    hd = a.head_dim or a.embd // H
    A, KH = H * hd, a.kv_heads or H
    bias = not a.no_bias
    i64 = lambda v: np.array(v, dtype=np.int64)
    if KH == H:
        qkv = g.linear(x, p + "attn.c_attn", bias)
        q, k, v = g.op("Split", [qkv, g.const(s + "attn/split", i64([A, A, A]))], s + "attn/Split", nout=3, axis=2)
    else:
        q, k, v = (g.linear(x, p + "attn.%s_proj" % n, bias) for n in "qkv")

    def heads(t, h, perm):
        r = g.op("Reshape", [t, g.const(s + "attn/shape", i64([B, T, h, hd]))], s + "attn/Reshape")
        return g.op("Transpose", [r], s + "attn/Transpose", perm=perm)

    if rope is None and KH == H:  # GPT-2's export: k straight to [B, H, hd, T]
        q, kt, v = heads(q, H, [0, 2, 1, 3]), heads(k, H, [0, 2, 3, 1]), heads(v, H, [0, 2, 1, 3])
    else:
        q, k, v = heads(q, H, [0, 2, 1, 3]), heads(k, KH, [0, 2, 1, 3]), heads(v, KH, [0, 2, 1, 3])
        if rope is not None:
            q = g.rotary(q, rope[0], rope[1], hd, s + "attn/rope")
            k = g.rotary(k, rope[0], rope[1], hd, s + "attn/rope")
        if KH != H:
            k = g.repeat_kv(k, B, KH, H // KH, T, hd, s + "attn/repeat_kv")
            v = g.repeat_kv(v, B, KH, H // KH, T, hd, s + "attn/repeat_kv")
        kt = g.op("Transpose", [k], s + "attn/Transpose", perm=[0, 1, 3, 2])
    att = g.op("Mul", [g.op("MatMul", [q, kt], s + "attn/MatMul"),
                       g.const(s + "attn/scale", np.array(1 / math.sqrt(hd), np.float32))], s + "attn/Mul")
    att = g.op("Where", [masked, g.const(s + "attn/neg_inf", np.array(-np.inf, np.float32)), att], s + "attn/Where")
    y = g.op("MatMul", [g.op("Softmax", [att], s + "attn/Softmax", axis=-1), v], s + "attn/MatMul")
    y = g.op("Reshape", [g.op("Transpose", [y], s + "attn/Transpose", perm=[0, 2, 1, 3]),
                         g.const(s + "attn/merged", i64([B, T, A]))], s + "attn/Reshape")
    return g.linear(y, p + "attn.c_proj", bias)


def mlp(g, x, p, s, a):
    """one block's MLP on x [B, T, D]: GELU (erf form or the Gelu op) or SwiGLU (down(silu(gate x) * up x))"""
    bias = not a.no_bias
    if a.mlp == "swiglu":
        gate = g.linear(x, p + "mlp.gate_proj", bias)
        silu = g.op("Mul", [gate, g.op("Sigmoid", [gate], s + "mlp/Sigmoid")], s + "mlp/Mul")
        h = g.op("Mul", [silu, g.linear(x, p + "mlp.up_proj", bias)], s + "mlp/Mul")
        return g.linear(h, p + "mlp.c_proj", bias)
    h = g.linear(x, p + "mlp.c_fc", bias)
    if a.gelu == "op":
        h = g.op("Gelu", [h], s + "mlp/gelu/Gelu")
    else:
        f32 = lambda v: np.array(v, dtype=np.float32)
        e = g.op("Erf", [g.op("Div", [h, g.const(s + "mlp/gelu/sqrt2", f32(math.sqrt(2)))], s + "mlp/gelu/Div")],
                 s + "mlp/gelu/Erf")
        e = g.op("Add", [e, g.const(s + "mlp/gelu/one", f32(1.0))], s + "mlp/gelu/Add")
        h = g.op("Mul", [g.op("Mul", [h, e], s + "mlp/gelu/Mul"), g.const(s + "mlp/gelu/half", f32(0.5))],
                 s + "mlp/gelu/Mul")
    return g.linear(h, p + "mlp.c_proj", bias)


def build(a):
    T = a.block
    hd = a.head_dim or a.embd // a.heads
    g = Graph(opset_of(a))
    f32 = lambda v: np.array(v, dtype=np.float32)
    i64 = lambda v: np.array(v, dtype=np.int64)
    x = g.op("Gather", ["transformer.wte.weight", "input_ids"], "/wte/Gather")
    if a.pos == "learned":
        pos = g.op("Range", [g.const("pos_start", i64(0)), g.const("pos_limit", i64(T)),
                             g.const("pos_delta", i64(1))], "/Range")
        x = g.op("Add", [x, g.op("Gather", ["transformer.wpe.weight", pos], "/wpe/Gather")], "/Add")
    rope = None
    if a.pos == "rotary":
        cos, sin = rope_tables(T, hd)
        rope = (g.const("/rope/cos", cos), g.const("/rope/sin", sin))
    # --mask buffer: nanoGPT's float buffer (tril of ones) in the data file; bool: the masked keys as a bool
    # initializer inside the model, which fsdpc reads without the data file and so computes as the causal band
    masked = g.op("Equal", ["causal_mask", g.const("/mask_zero", f32(0.0))], "/Equal") if a.mask == "buffer" \
        else "causal_mask"
    for i in range(a.layers):
        p, s = "transformer.h.%d." % i, "/h.%d/" % i
        x = g.op("Add", [x, attention(g, g.norm(x, p + "ln_1", a.norm), p, s, a, masked, rope)], s + "Add")
        x = g.op("Add", [x, mlp(g, g.norm(x, p + "ln_2", a.norm), p, s, a)], s + "Add")
    x = g.norm(x, "transformer.ln_f", a.norm)
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
    ap.add_argument("--norm", choices=["layer", "rms"], default="layer", help="LayerNorm (default) or RMSNorm")
    ap.add_argument("--mlp", choices=["gelu", "swiglu"], default="gelu",
                    help="GELU MLP (c_fc, c_proj) or SwiGLU (gate_proj, up_proj, c_proj)")
    ap.add_argument("--pos", choices=["learned", "rotary", "none"], default="learned",
                    help="learned positions (wpe), rotary embeddings of q and k, or none (as ALiBi's FLOPs)")
    ap.add_argument("--kv-heads", type=int, default=0, help="grouped-query attention: K/V heads (default --heads)")
    ap.add_argument("--no-bias", action="store_true", help="Linear layers without bias")
    ap.add_argument("--mask", choices=["bool", "buffer"], default="bool",
                    help="the causal mask: a bool initializer inside the model (T x T bytes; fsdpc reads it "
                         "without the data file and computes the causal band: the default) or nanoGPT's float "
                         "buffer in the data file (a plan without the file keeps it as a tensor)")
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
    if a.kv_heads < 0 or (a.kv_heads and a.heads % a.kv_heads):
        ap.error("--heads must be a multiple of --kv-heads")
    if a.pos == "rotary" and (a.head_dim or a.embd // a.heads) % 2:
        ap.error("--pos rotary needs an even head width")
    inner = a.heads * a.head_dim if a.head_dim else None
    T = a.block
    data_name = os.path.basename(a.out) + ".data"
    data_path = os.path.join(os.path.dirname(os.path.abspath(a.out)), data_name)
    inits, layout, off = [], [], 0
    arch = arch_of(a)
    mask = [("causal_mask", [1, 1, T, T], "mask")] if a.mask == "buffer" else []
    for name, shape, kind in params(a.layers, a.embd, T, a.vocab, a.untied, a.ffn or None, inner, arch, a.heads) + mask:
        t, nbytes = external(name, shape, data_name, off)
        inits.append(t)
        layout.append((off, shape, kind))
        off = (off + nbytes + ALIGN - 1) // ALIGN * ALIGN
    g = build(a)
    if a.mask == "bool":
        inits.append(numpy_helper.from_array(~np.tril(np.ones((1, 1, T, T), bool)), "causal_mask"))
    graph = helper.make_graph(g.nodes, "shaped_gpt", [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [a.batch, T])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [a.batch, T, a.vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset_of(a))],
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
        a.out, param_count(a.layers, a.embd, T, a.vocab, a.untied, a.ffn or None, inner, arch, a.heads), len(g.nodes),
        data_path if a.data else "not written", off))


if __name__ == "__main__":
    main()
