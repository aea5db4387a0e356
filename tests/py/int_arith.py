"""Integer arithmetic at run time (passes/intarith.c), against NumPy.

usage: int_arith.py FSDPC WORKDIR

1. One --eval model whose integer inputs arrive at run time and go through
   every rewrite: int64 CumSum (plain, exclusive, reverse), int32 CumSum,
   Add/Sub/Mul/Div/Mod/Min/Max on int32 (Div and Mod with negative operands:
   ONNX's truncation and sign-of-divisor rules), Neg/Abs/Sign of int64 and
   int32, Pow of a float base with an int64 exponent and of an int64 base;
   every output must equal NumPy's exactly (floats: to the last bit NumPy's
   float32 Pow gives, within 1 ulp).  Transposes of int64, int32 and bool
   tensors (each moved in its own element size) beside them.
2. Training with Hugging Face's position ids computed at run time from the
   tokens: mask = ids != pad, pos = CumSum(mask) * mask - 1 clipped at 0
   (as transformers' position ids from an attention mask), logits from
   token and position embeddings; step 1's loss from the executable (lr 0)
   equals NumPy's at world 1 and 2.
"""
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, mpirun, read_metrics, run

B, T, V, C, PAD = 4, 6, 9, 5, 0


def vi(name, dt, shape):
    return helper.make_tensor_value_info(name, dt, shape)


def const(name, arr):
    return numpy_helper.from_array(np.asarray(arr), name)


def eval_model(path):
    N = helper.make_node
    I64, I32, F = TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT
    nodes = [
        N("CumSum", ["a", "ax1"], ["cs"]),
        N("CumSum", ["a", "ax1"], ["cs_ex"], exclusive=1),
        N("CumSum", ["a", "ax0"], ["cs_rev"], reverse=1),
        N("CumSum", ["p", "ax1"], ["cs32"]),
        N("Add", ["p", "q"], ["add32"]), N("Sub", ["p", "q"], ["sub32"]), N("Mul", ["p", "q"], ["mul32"]),
        N("Div", ["p", "q"], ["div32"]), N("Mod", ["p", "q"], ["mod32"]), N("Mod", ["p", "q"], ["fmod32"], fmod=1),
        N("Min", ["p", "q"], ["min32"]), N("Max", ["p", "q"], ["max32"]),
        N("Neg", ["a"], ["neg"]), N("Abs", ["a"], ["abs"]), N("Sign", ["a"], ["sign"]),
        N("Neg", ["p"], ["neg32"]), N("Abs", ["p"], ["abs32"]), N("Sign", ["p"], ["sign32"]),
        N("Pow", ["f", "e"], ["powf"]), N("Pow", ["e", "two"], ["powi"]),
        N("Transpose", ["a"], ["tr64"], perm=[1, 0]), N("Transpose", ["p"], ["tr32"], perm=[1, 0]),
        N("Greater", ["a", "zero"], ["pos_b"]), N("Transpose", ["pos_b"], ["trb_b"], perm=[1, 0]),
        N("Cast", ["trb_b"], ["trb"], to=I64),
    ]
    outs = [("cs", I64), ("cs_ex", I64), ("cs_rev", I64), ("cs32", I32), ("add32", I32), ("sub32", I32),
            ("mul32", I32), ("div32", I32), ("mod32", I32), ("fmod32", I32), ("min32", I32), ("max32", I32),
            ("neg", I64), ("abs", I64), ("sign", I64), ("neg32", I32), ("abs32", I32), ("sign32", I32),
            ("powf", F), ("powi", I64), ("tr64", I64), ("tr32", I32), ("trb", I64)]
    g = helper.make_graph(nodes, "ints",
                          [vi("a", I64, [B, T]), vi("p", I32, [B, T]), vi("q", I32, [B, T]), vi("f", F, [B, T]),
                           vi("e", I64, [B, T])],
                          [vi(n, t, None) for n, t in outs],
                          [const("ax1", np.int64(1)), const("ax0", np.int64(0)), const("two", np.int64(2)),
                           const("zero", np.int64(0))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return [n for n, _ in outs]


def expected(a, p, q, f, e):
    c = lambda x: x.astype(np.int32)
    rev = np.flip(np.cumsum(np.flip(a, 0), 0), 0)
    cs = np.cumsum(a, 1)
    return {"cs": cs, "cs_ex": cs - a, "cs_rev": rev, "cs32": c(np.cumsum(p, 1)),
            "add32": p + q, "sub32": p - q, "mul32": p * q,
            "div32": c(np.trunc(p / q)), "mod32": np.mod(p, q), "fmod32": c(np.fmod(p, q)),
            "min32": np.minimum(p, q), "max32": np.maximum(p, q),
            "neg": -a, "abs": np.abs(a), "sign": np.sign(a), "neg32": -p, "abs32": np.abs(p), "sign32": np.sign(p),
            "powf": np.power(f, e.astype(np.float32)), "powi": e ** 2,
            "tr64": a.T.copy(), "tr32": p.T.copy(), "trb": (a > 0).T.astype(np.int64)}


def check_eval(fsdpc, work):
    J = lambda *x: os.path.join(work, *x)
    names = eval_model(J("ints.onnx"))
    run([fsdpc, J("ints.onnx"), "-o", J("ints"), "--target", "cpu", "--eval", "--verify"])
    rng = np.random.default_rng(3)
    ins = {"a": rng.integers(-50, 50, (B, T)).astype(np.int64),
           "p": rng.integers(-40, 40, (B, T)).astype(np.int32),
           "q": rng.choice([-7, -3, -2, -1, 1, 2, 5, 9], (B, T)).astype(np.int32),
           "f": rng.uniform(0.5, 2.0, (B, T)).astype(np.float32),
           "e": rng.integers(-3, 6, (B, T)).astype(np.int64)}
    args = [J("ints"), "--out-dir", J("out"), "--quiet"]
    for k, v in ins.items():
        np.save(J(k + ".npy"), v)
        args += ["--input", "%s=%s" % (k, J(k + ".npy"))]
    run(args)
    want = expected(**ins)
    for n in names:
        got, ref = np.load(J("out", n + ".npy")), want[n]
        check(got.dtype == ref.dtype and got.shape == ref.shape,
              "%s: %s %s, NumPy %s %s" % (n, got.dtype, got.shape, ref.dtype, ref.shape))
        if ref.dtype.kind == "f":
            ulp = np.abs(got.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64)).max()
            check(ulp <= 1, "%s: %d ulp from NumPy" % (n, ulp))
        else:
            check(np.array_equal(got, ref), "%s differs from NumPy:\n%s\n%s" % (n, got, ref))
    print("eval: %d integer outputs = NumPy" % len(names))


def train_model(path, tok, pos, W):
    N = helper.make_node
    nodes = [
        N("Equal", ["ids", "pad"], ["is_pad"]), N("Not", ["is_pad"], ["keep"]),
        N("Cast", ["keep"], ["mask"], to=TensorProto.INT64),
        N("CumSum", ["mask", "ax1"], ["run"]), N("Mul", ["run", "mask"], ["runm"]),
        N("Sub", ["runm", "one"], ["pos1"]), N("Max", ["pos1", "zero"], ["pos_ids"]),
        N("Gather", ["tok", "ids"], ["te"]), N("Gather", ["pos", "pos_ids"], ["pe"]),
        N("Add", ["te", "pe"], ["h"]), N("MatMul", ["h", "W"], ["logits"]),
    ]
    g = helper.make_graph(nodes, "hfpos", [vi("ids", TensorProto.INT64, ["batch", T])],
                          [vi("logits", TensorProto.FLOAT, ["batch", T, V])],
                          [const("pad", np.int64(PAD)), const("ax1", np.int64(1)), const("one", np.int64(1)),
                           const("zero", np.int64(0)), numpy_helper.from_array(tok, "tok"),
                           numpy_helper.from_array(pos, "pos"), numpy_helper.from_array(W, "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def ref_loss(ids, labels, tok, pos, W):
    mask = (ids != PAD).astype(np.int64)
    p = np.maximum(np.cumsum(mask, 1) * mask - 1, 0)
    z = (tok[ids].astype(np.float64) + pos[p]) @ W
    z -= z.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(lp, labels[..., None], -1).mean()


def check_train(fsdpc, work):
    J = lambda *x: os.path.join(work, *x)
    rng = np.random.default_rng(5)
    tok = rng.standard_normal((V, C)).astype(np.float32)
    pos = rng.standard_normal((T, C)).astype(np.float32)
    W = rng.standard_normal((C, V)).astype(np.float32)
    train_model(J("hf.onnx"), tok, pos, W)
    ids = rng.integers(1, V, (B, T)).astype(np.int64)
    ids[0, :2] = PAD  # left padding, as a batch of prompts
    ids[1, -1] = PAD  # right padding
    labels = rng.integers(0, V, (B, T)).astype(np.int64)
    np.save(J("ids.npy"), ids)
    np.save(J("labels.npy"), labels)
    want = ref_loss(ids, labels, tok, pos, W)
    for world in (1, 2):
        exe = J("train%d" % world)
        run([fsdpc, J("hf.onnx"), "-o", exe, "--target", "cpu", "--loss", "cross_entropy:logits,labels",
             "--optimizer", "sgd", "--dim", "batch=%d" % (B // world), "--world", str(world), "--verify"])
        m = J("m%d.jsonl" % world)
        run(mpirun(world, [exe, "--data", "ids=" + J("ids.npy"), "--data", "labels=" + J("labels.npy"),
                           "--steps", "1", "--lr", "0", "--metrics", m, "--quiet"]))
        got = read_metrics(m)[0][0]
        check(abs(got - want) <= 1e-5 * abs(want), "world %d: loss %.8f, NumPy %.8f" % (world, got, want))
        print("train world %d: step 1 loss %.7f = NumPy %.7f" % (world, got, want))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    check_eval(fsdpc, work)
    check_train(fsdpc, work)
    print("int_arith: OK")


if __name__ == "__main__":
    main()
