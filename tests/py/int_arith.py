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
3. Narrow dtypes (passes/intarith.c's narrow_begin/narrow_end): one --eval
   model with inputs of int8, uint8, int16, uint16, uint32, uint64, float16
   and bfloat16 read from .npy files (bfloat16 from float32, numpy having
   none): wrapping Add/Sub/Mul, Div/Mod/Min/Max/comparisons on the narrow
   values, CumSum, Neg/Abs of int8's -128, Casts between them, float16 and
   bfloat16 arithmetic rounded per op; every output equals NumPy's exactly
   (bfloat16 emulated by rounding float32 to its top 16 bits).  Ordering a
   uint64 is refused in one line naming the node.
4. A uint8 image input through a training executable's --data: pixels / 255
   into a linear classifier; step 1's loss (lr 0) equals NumPy's.
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


def bf16(x):
    """float32 x rounded to bfloat16 (nearest even), as float32"""
    b = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32)


def narrow_model(path):
    N, P = helper.make_node, TensorProto
    nodes = [
        N("Add", ["u8a", "u8b"], ["u8_add"]), N("Sub", ["u8a", "u8b"], ["u8_sub"]), N("Mul", ["u8a", "u8b"], ["u8_mul"]),
        N("Div", ["u8a", "u8b"], ["u8_div"]), N("Mod", ["u8a", "u8b"], ["u8_mod"]), N("Max", ["u8a", "u8b"], ["u8_max"]),
        N("Greater", ["u8a", "u8b"], ["u8_gt"]), N("Transpose", ["u8a"], ["u8_t"], perm=[1, 0]),
        N("Cast", ["u8a"], ["u8_f"], to=P.FLOAT),
        N("Add", ["i8a", "i8b"], ["i8_add"]), N("Neg", ["i8a"], ["i8_neg"]), N("Abs", ["i8a"], ["i8_abs"]),
        N("Div", ["i8a", "i8b"], ["i8_div"]), N("Mod", ["i8a", "i8b"], ["i8_mod"]), N("Min", ["i8a", "i8b"], ["i8_min"]),
        N("Mul", ["i16", "i16"], ["i16_sq"]), N("Sub", ["u16a", "u16b"], ["u16_sub"]),
        N("CumSum", ["u16a", "ax1"], ["u16_cs"]), N("Mul", ["u32a", "u32b"], ["u32_mul"]),
        N("Less", ["u32a", "u32b"], ["u32_lt"]), N("Add", ["u64a", "u64b"], ["u64_add"]),
        N("Equal", ["u64a", "u64b"], ["u64_eq"]), N("Cast", ["i16"], ["i16_i8"], to=P.INT8),
        N("Cast", ["f16b"], ["f16_u8"], to=P.UINT8),
        N("Add", ["f16a", "f16b"], ["f16_add"]), N("Mul", ["f16a", "f16b"], ["f16_mul"]),
        N("Div", ["f16a", "f16b"], ["f16_div"]), N("Sqrt", ["f16b"], ["f16_sqrt"]),
        N("Add", ["bfa", "bfb"], ["bf_add"]), N("Mul", ["bfa", "bfb"], ["bf_mul"]),
        N("Cast", ["f16a"], ["f16_bf"], to=P.BFLOAT16),
    ]
    ins = {"u8a": P.UINT8, "u8b": P.UINT8, "i8a": P.INT8, "i8b": P.INT8, "i16": P.INT16, "u16a": P.UINT16,
           "u16b": P.UINT16, "u32a": P.UINT32, "u32b": P.UINT32, "u64a": P.UINT64, "u64b": P.UINT64,
           "f16a": P.FLOAT16, "f16b": P.FLOAT16, "bfa": P.BFLOAT16, "bfb": P.BFLOAT16}
    outs = [n.output[0] for n in nodes]
    g = helper.make_graph(nodes, "narrow", [vi(k, t, [B, T]) for k, t in ins.items()], [vi(n, 0, None) for n in outs],
                          [const("ax1", np.int64(1))])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    return outs


def narrow_expected(i):
    w = lambda f: f()  # NumPy's own wraparound for the integer ops
    with np.errstate(over="ignore"):
        return {"u8_add": w(lambda: i["u8a"] + i["u8b"]), "u8_sub": i["u8a"] - i["u8b"], "u8_mul": i["u8a"] * i["u8b"],
                "u8_div": i["u8a"] // i["u8b"], "u8_mod": i["u8a"] % i["u8b"], "u8_max": np.maximum(i["u8a"], i["u8b"]),
                "u8_gt": i["u8a"] > i["u8b"], "u8_t": i["u8a"].T, "u8_f": i["u8a"].astype(np.float32),
                "i8_add": i["i8a"] + i["i8b"], "i8_neg": -i["i8a"], "i8_abs": np.abs(i["i8a"]),
                "i8_div": np.trunc(i["i8a"] / i["i8b"]).astype(np.int64).astype(np.int8),
                "i8_mod": np.mod(i["i8a"], i["i8b"]), "i8_min": np.minimum(i["i8a"], i["i8b"]),
                "i16_sq": i["i16"] * i["i16"], "u16_sub": i["u16a"] - i["u16b"],
                "u16_cs": np.cumsum(i["u16a"], 1, dtype=np.uint16), "u32_mul": i["u32a"] * i["u32b"],
                "u32_lt": i["u32a"] < i["u32b"], "u64_add": i["u64a"] + i["u64b"], "u64_eq": i["u64a"] == i["u64b"],
                "i16_i8": i["i16"].astype(np.int8), "f16_u8": i["f16b"].astype(np.uint8),
                "f16_add": i["f16a"] + i["f16b"], "f16_mul": i["f16a"] * i["f16b"], "f16_div": i["f16a"] / i["f16b"],
                "f16_sqrt": np.sqrt(i["f16b"]), "bf_add": bf16(i["bfa"] + i["bfb"]), "bf_mul": bf16(i["bfa"] * i["bfb"]),
                "f16_bf": bf16(i["f16a"].astype(np.float32))}


def check_narrow(fsdpc, work):
    J = lambda *x: os.path.join(work, *x)
    names = narrow_model(J("narrow.onnx"))
    run([fsdpc, J("narrow.onnx"), "-o", J("narrow"), "--target", "cpu", "--eval", "--verify"])
    r = np.random.default_rng(7)
    ints = lambda dt, lo, hi: r.integers(lo, hi, (B, T), endpoint=True).astype(dt)
    i = {"u8a": ints(np.uint8, 0, 255), "u8b": ints(np.uint8, 1, 255), "i8a": ints(np.int8, -128, 127),
         "i8b": r.choice([-128, -7, -3, -1, 1, 2, 5, 127], (B, T)).astype(np.int8), "i16": ints(np.int16, -32768, 32767),
         "u16a": ints(np.uint16, 0, 65535), "u16b": ints(np.uint16, 0, 65535),
         "u32a": ints(np.uint32, 0, 2 ** 32 - 1), "u32b": ints(np.uint32, 0, 2 ** 32 - 1),
         "u64a": (r.integers(0, 2 ** 63, (B, T), dtype=np.uint64) * np.uint64(2) + np.uint64(1)),
         "f16a": r.uniform(-300, 300, (B, T)).astype(np.float16), "f16b": r.uniform(0.01, 40, (B, T)).astype(np.float16),
         "bfa": bf16(r.standard_normal((B, T))), "bfb": bf16(r.standard_normal((B, T)) * 100)}
    i["i8a"][0, 0] = -128  # Neg and Abs of -128 wrap to -128, as NumPy's
    i["u64b"] = i["u64a"].copy()
    i["u64b"][1:] = np.uint64(2 ** 64 - 3)  # sums past 2^64 wrap
    i["f16a"][0, :3] = [1e-3, 70000 / 300, -0.5]
    args = [J("narrow"), "--out-dir", J("nout"), "--quiet"]
    for k, v in i.items():
        np.save(J(k + ".npy"), v)
        args += ["--input", "%s=%s" % (k, J(k + ".npy"))]
    run(args)
    with np.errstate(invalid="ignore"):
        want = narrow_expected(i)
    for n in names:
        got, ref = np.load(J("nout", n + ".npy")), want[n]
        check(got.dtype == ref.dtype and got.shape == ref.shape,
              "%s: %s %s, NumPy %s %s" % (n, got.dtype, got.shape, ref.dtype, ref.shape))
        check(np.array_equal(got, ref), "%s differs from NumPy:\n%s\n%s" % (n, got, ref))
    print("narrow: %d outputs of int8 .. uint64, float16, bfloat16 = NumPy" % len(names))
    # ordering uint64 in int64 would be wrong above 2^63: refused, one line naming the node
    g = helper.make_graph([helper.make_node("Less", ["a", "b"], ["y"], name="cmp64")], "u64",
                          [vi("a", TensorProto.UINT64, [2]), vi("b", TensorProto.UINT64, [2])],
                          [vi("y", TensorProto.BOOL, [2])])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J("u64.onnx"))
    p = run([fsdpc, J("u64.onnx"), "-o", J("u64"), "--target", "cpu", "--eval"], check=False)
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 1 and len(lines) == 1 and "cmp64" in lines[0] and "u64" in lines[0],
          "uint64 Less: exit %d, %r" % (p.returncode, p.stderr))
    print("uint64 ordering refused: %s" % lines[0])


def check_image(fsdpc, work):
    J = lambda *x: os.path.join(work, *x)
    r = np.random.default_rng(9)
    H, K = 12, 3
    W = r.standard_normal((H, K)).astype(np.float32)
    N = helper.make_node
    nodes = [N("Cast", ["img"], ["f"], to=TensorProto.FLOAT), N("Div", ["f", "scale"], ["x"]),
             N("MatMul", ["x", "W"], ["logits"])]
    g = helper.make_graph(nodes, "img", [vi("img", TensorProto.UINT8, ["batch", H])],
                          [vi("logits", TensorProto.FLOAT, ["batch", K])],
                          [const("scale", np.float32(255)), numpy_helper.from_array(W, "W")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J("img.onnx"))
    img = r.integers(0, 256, (B, H)).astype(np.uint8)
    labels = r.integers(0, K, (B,)).astype(np.int64)
    np.save(J("img.npy"), img)
    np.save(J("img_labels.npy"), labels)
    run([fsdpc, J("img.onnx"), "-o", J("imgtrain"), "--target", "cpu", "--loss", "cross_entropy:logits,labels",
         "--optimizer", "sgd", "--dim", "batch=%d" % B, "--verify"])
    m = J("img.jsonl")
    run(mpirun(1, [J("imgtrain"), "--data", "img=" + J("img.npy"), "--data", "labels=" + J("img_labels.npy"),
                   "--steps", "1", "--lr", "0", "--metrics", m, "--quiet"]))
    z = (img.astype(np.float64) / 255) @ W
    z -= z.max(-1, keepdims=True)
    want = -(z - np.log(np.exp(z).sum(-1, keepdims=True)))[np.arange(B), labels].mean()
    got = read_metrics(m)[0][0]
    check(abs(got - want) <= 1e-5 * abs(want), "uint8 image: loss %.8f, NumPy %.8f" % (got, want))
    print("uint8 image --data: step 1 loss %.7f = NumPy %.7f" % (got, want))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    check_eval(fsdpc, work)
    check_narrow(fsdpc, work)
    check_image(fsdpc, work)
    check_train(fsdpc, work)
    print("int_arith: OK")


if __name__ == "__main__":
    main()
