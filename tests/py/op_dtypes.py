"""ops.def's types column against what fsdpc does: every ONNX op, every model dtype.

usage: op_dtypes.py FSDPC WORKDIR

For each ONNX op of ir/ops.def (read with scripts/gen_ops_md.py's parser, so docs/ops.md's dtypes column is
what is checked), a one-node model is built with onnx.helper for each dtype a model may hold (float32,
float64, int64, int32, bool) in the op's data input(s), and compiled with `fsdpc --eval`.  The dtypes it
compiles must be exactly the op's class (T_FLOAT: float32 and float64, T_ANY: all five, ...); a dtype it
refuses must be refused with one line (exit 1).  An ONNX op without a builder here fails the test: a new
row of ops.def comes with its probe.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import gen_ops_md  # noqa: E402  (the parser of ir/ops.def)

from common import drop, run  # noqa: E402

DT = {"f32": TensorProto.FLOAT, "f64": TensorProto.DOUBLE, "i64": TensorProto.INT64, "i32": TensorProto.INT32,
      "bool": TensorProto.BOOL}
NP = {"f32": np.float32, "f64": np.float64, "i64": np.int64, "i32": np.int32, "bool": np.bool_}
ALL = set(DT)
FLOAT = {"f32", "f64"}
# what each dtype class of ops.def's head accepts in the probed input(s)
CLASS = {"T_FLOAT": FLOAT, "T_ANY": ALL, "T_BOOL": {"bool"}, "T_CMP": ALL,
         "T_TEST": FLOAT, "T_INDEX": FLOAT, "T_SHAPE": ALL, "T_NUMBER": ALL - {"bool"}}

N = helper.make_node
I64 = lambda *a: np.array(a, np.int64)


def x(d, shape=(2, 3)):
    return (d, list(shape))


def probes():
    """op -> (builder(d) -> (nodes, inputs {name: (dtype, shape)}, initializers, outputs), opset)"""
    p = {}
    unary = lambda op, **kw: lambda d: ([N(op, ["a"], ["y"], **kw)], {"a": x(d)}, {}, ["y"])
    binary = lambda op: lambda d: ([N(op, ["a", "b"], ["y"])], {"a": x(d), "b": x(d)}, {}, ["y"])
    for op in ("Relu Tanh Sigmoid Sqrt Reciprocal Exp Log Neg Abs Erf LeakyRelu Elu Selu Celu ThresholdedRelu "
               "Softsign Softplus Clip Cos Sin Tan Asin Acos Atan Sinh Cosh Asinh Acosh Atanh Floor Ceil "
               "Round Sign HardSigmoid HardSwish Gelu Identity Transpose Flatten Shape Size Not IsNaN IsInf ArgMax "
               "ArgMin Softmax LogSoftmax ReduceMean ReduceSum ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 "
               "ReduceSumSquare ReduceLogSum ReduceLogSumExp Dropout").split():
        p[op] = unary(op)
    for op in "Add Sub Mul Div Min Max Mod Pow Sum Mean Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor".split():
        p[op] = binary(op)
    p["Cast"] = unary("Cast", to=TensorProto.FLOAT)
    p["OneHot"] = lambda d: ([N("OneHot", ["i", "n", "v"], ["y"])], {"i": x(d)},
                             {"n": np.array(3, np.int64), "v": np.array([0, 1], np.float32)}, ["y"])
    p["Trilu"] = unary("Trilu")
    p["CastLike"] = lambda d: ([N("CastLike", ["a", "b"], ["y"])], {"a": x(d), "b": x("f32", [1])}, {}, ["y"])
    p["Constant"] = lambda d: ([N("Constant", [], ["y"], value=numpy_helper.from_array(np.ones(2, NP[d])))],
                               {}, {}, ["y"])
    p["ConstantOfShape"] = lambda d: ([N("ConstantOfShape", ["s"], ["y"],
                                         value=numpy_helper.from_array(np.ones(1, NP[d])))], {}, {"s": I64(2, 3)},
                                      ["y"])
    p["Range"] = lambda d: ([N("Range", ["s", "l", "e"], ["y"])], {},
                            {k: np.array(v, NP[d]) for k, v in (("s", 0), ("l", 5), ("e", 1))}, ["y"])
    p["MatMul"] = lambda d: ([N("MatMul", ["a", "b"], ["y"])], {"a": x(d, (2, 3)), "b": x(d, (3, 4))}, {}, ["y"])
    p["Gemm"] = lambda d: ([N("Gemm", ["a", "b"], ["y"])], {"a": x(d, (2, 3)), "b": x(d, (3, 4))}, {}, ["y"])
    p["Einsum"] = lambda d: ([N("Einsum", ["a", "b"], ["y"], equation="ij,jk->ik")],
                             {"a": x(d, (2, 3)), "b": x(d, (3, 4))}, {}, ["y"])
    const_in = {"Reshape": I64(3, 2), "Squeeze": I64(0), "Unsqueeze": I64(0), "Expand": I64(3, 2, 3),
                "Tile": I64(2, 1), "Pad": I64(0, 1, 0, 1), "CumSum": np.array(1, np.int64),
                "CumProd": np.array(1, np.int64)}
    for op, c in const_in.items():
        p[op] = (lambda op, c: lambda d: ([N(op, ["a", "c"], ["y"])], {"a": x(d, (1, 6) if op == "Squeeze" else
                                                                                 (2, 3))}, {"c": c}, ["y"]))(op, c)
    for op, g in (("RNN", 1), ("GRU", 3), ("LSTM", 4)):
        p[op] = (lambda op, g: lambda d: ([N(op, ["a", "w", "r"], ["y"], hidden_size=2)],
                                          {"a": x(d, (3, 1, 2)), "w": x(d, (1, 2 * g, 2)), "r": x(d, (1, 2 * g, 2))},
                                          {}, ["y"]))(op, g)
    for op in ("InstanceNormalization", "GroupNormalization"):
        p[op] = (lambda op: lambda d: ([N(op, ["a", "s", "b"], ["y"], **({"num_groups": 1} if "Group" in op else {}))],
                                       {"a": x(d, (1, 1, 3, 3))}, {"s": np.ones(1, NP[d]), "b": np.zeros(1, NP[d])},
                                       ["y"]))(op)
    for op in ("LpNormalization", "Hardmax", "Swish", "Shrink"):
        p[op] = (lambda op: lambda d: ([N(op, ["a"], ["y"])], {"a": x(d, (2, 3))}, {}, ["y"]))(op)
    p["PRelu"] = lambda d: ([N("PRelu", ["a", "s"], ["y"])], {"a": x(d, (2, 3))}, {"s": np.ones(3, NP[d])}, ["y"])
    p["EyeLike"] = lambda d: ([N("EyeLike", ["a"], ["y"])], {"a": x(d, (2, 3))}, {}, ["y"])
    p["CenterCropPad"] = lambda d: ([N("CenterCropPad", ["a", "s"], ["y"])], {"a": x(d, (2, 3))}, {"s": I64(1, 4)},
                                    ["y"])
    p["AffineGrid"] = lambda d: ([N("AffineGrid", ["a", "s"], ["y"])], {"a": x(d, (1, 2, 3))}, {"s": I64(1, 1, 2, 2)},
                                 ["y"])
    p["GridSample"] = lambda d: ([N("GridSample", ["a", "g"], ["y"])], {"a": x(d, (1, 1, 2, 2)), "g": x(d, (1, 2, 2, 2))},
                                 {}, ["y"])
    p["SwiGLU"] = lambda d: ([N("SwiGLU", ["a", "b"], ["y"])], {"a": x(d), "b": x(d)}, {}, ["y"])
    for op in ("HannWindow", "HammingWindow", "BlackmanWindow"):  # the class is output_datatype's
        p[op] = (lambda op: lambda d: ([N(op, ["s"], ["y"], output_datatype=DT[d])], {}, {"s": np.array(4, np.int64)},
                                       ["y"]))(op)
    p["LRN"] = lambda d: ([N("LRN", ["a"], ["y"], size=3)], {"a": x(d, (1, 2, 3, 3))}, {}, ["y"])
    p["ReverseSequence"] = lambda d: ([N("ReverseSequence", ["a", "l"], ["y"])], {"a": x(d, (3, 2))},
                                      {"l": I64(2, 3)}, ["y"])
    p["TopK"] = lambda d: ([N("TopK", ["a", "k"], ["y", "i"])], {"a": x(d, (2, 3))}, {"k": I64(2)}, ["y", "i"])
    p["Concat"] = lambda d: ([N("Concat", ["a", "b"], ["y"], axis=0)], {"a": x(d), "b": x(d)}, {}, ["y"])
    p["Split"] = lambda d: ([N("Split", ["a"], ["y", "z"], axis=0, num_outputs=2)], {"a": x(d, (4, 3))}, {},
                            ["y", "z"])
    p["Slice"] = lambda d: ([N("Slice", ["a", "s", "e"], ["y"])], {"a": x(d)}, {"s": I64(1), "e": I64(2)}, ["y"])
    p["Gather"] = lambda d: ([N("Gather", ["a", "i"], ["y"])], {"a": x(d)}, {"i": I64(1, 0)}, ["y"])
    p["GatherElements"] = lambda d: ([N("GatherElements", ["a", "i"], ["y"])], {"a": x(d)},
                                     {"i": np.zeros((2, 3), np.int64)}, ["y"])
    p["GatherND"] = lambda d: ([N("GatherND", ["a", "i"], ["y"])], {"a": x(d)}, {"i": np.zeros((4, 2), np.int64)},
                               ["y"])
    p["ScatterND"] = lambda d: ([N("ScatterND", ["a", "i", "u"], ["y"])], {"a": x(d), "u": x(d, (2,))},
                                {"i": np.array([[0, 1], [1, 2]], np.int64)}, ["y"])
    p["ScatterElements"] = lambda d: ([N("ScatterElements", ["a", "i", "u"], ["y"])], {"a": x(d), "u": x(d, (1, 2))},
                                      {"i": np.array([[0, 1]], np.int64)}, ["y"])
    p["Where"] = lambda d: ([N("Where", ["c", "a", "b"], ["y"])], {"c": x("bool"), "a": x(d), "b": x(d)}, {}, ["y"])
    p["Resize"] = lambda d: ([N("Resize", ["a", "", "s"], ["y"])], {"a": x(d, (1, 1, 2, 2))},
                             {"s": np.array([1, 1, 2, 2], np.float32)}, ["y"])
    img = lambda op, **kw: lambda d: ([N(op, ["a"], ["y"], **kw)], {"a": x(d, (1, 1, 3, 3))}, {}, ["y"])
    p["MaxPool"] = img("MaxPool", kernel_shape=[2, 2])
    p["AveragePool"] = img("AveragePool", kernel_shape=[2, 2])
    p["LpPool"] = img("LpPool", kernel_shape=[2, 2], p=3)
    p["GlobalAveragePool"] = img("GlobalAveragePool")
    p["GlobalMaxPool"] = img("GlobalMaxPool")
    p["SpaceToDepth"] = img("SpaceToDepth", blocksize=1)
    p["DepthToSpace"] = img("DepthToSpace", blocksize=1)
    p["Conv"] = lambda d: ([N("Conv", ["a", "w"], ["y"])], {"a": x(d, (1, 1, 3, 3)), "w": x(d, (1, 1, 2, 2))}, {},
                           ["y"])
    p["ConvTranspose"] = lambda d: ([N("ConvTranspose", ["a", "w"], ["y"])],
                                    {"a": x(d, (1, 1, 3, 3)), "w": x(d, (1, 1, 2, 2))}, {}, ["y"])
    p["BatchNormalization"] = lambda d: ([N("BatchNormalization", ["a", "s", "b", "m", "v"], ["y"])],
                                         dict({"a": x(d, (2, 3, 2))}, **{k: x(d, (3,)) for k in "sbmv"}), {}, ["y"])
    p["LayerNormalization"] = lambda d: ([N("LayerNormalization", ["a", "s"], ["y"])], {"a": x(d), "s": x(d, (3,))},
                                         {}, ["y"])
    p["RMSNormalization"] = lambda d: ([N("RMSNormalization", ["a", "s"], ["y"])], {"a": x(d), "s": x(d, (3,))},
                                       {}, ["y"])
    for op in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"):
        p[op] = (lambda op: lambda d: ([N(op, ["a", "l"], ["y"])], {"a": x(d), "l": x("i64", (2,))}, {}, ["y"]))(op)
    p["Attention"] = lambda d: ([N("Attention", ["q", "k", "v"], ["y"])], {k: x(d, (1, 1, 2, 4)) for k in "qkv"},
                                {}, ["y"])
    p["RotaryEmbedding"] = lambda d: ([N("RotaryEmbedding", ["a", "c", "s", "p"], ["y"], num_heads=1)],
                                      {"a": x(d, (1, 2, 4)), "c": x(d, (4, 2)), "s": x(d, (4, 2))},
                                      {"p": np.zeros((1, 2), np.int64)}, ["y"])
    seq = lambda *nodes, inits=None: lambda d: (list(nodes), {"a": x(d), "b": x(d)}, inits or {}, ["y"])
    at = N("SequenceAt", ["s", "p"], ["y"])
    zero = {"p": np.array(0, np.int64)}
    p["SequenceConstruct"] = seq(N("SequenceConstruct", ["a", "b"], ["s"]), at, inits=zero)
    p["SequenceAt"] = p["SequenceConstruct"]
    p["SequenceInsert"] = seq(N("SequenceConstruct", ["a"], ["t"]), N("SequenceInsert", ["t", "b"], ["s"]), at,
                              inits=zero)
    p["SequenceErase"] = seq(N("SequenceConstruct", ["a", "b"], ["t"]), N("SequenceErase", ["t"], ["s"]), at,
                             inits=zero)
    p["SplitToSequence"] = seq(N("SplitToSequence", ["a"], ["s"], axis=0), at, inits=zero)
    p["ConcatFromSequence"] = seq(N("SequenceConstruct", ["a", "b"], ["s"]),
                                  N("ConcatFromSequence", ["s"], ["y"], axis=0))
    p["SequenceLength"] = seq(N("SequenceConstruct", ["a", "b"], ["s"]), N("SequenceLength", ["s"], ["y"]))
    p["SequenceEmpty"] = lambda d: ([N("SequenceEmpty", [], ["t"], dtype=DT[d]), N("SequenceInsert", ["t", "a"], ["s"]),
                                     at], {"a": x(d)}, zero, ["y"])
    return p


def compile_(fsdpc, work, tag, build, d, opset):
    nodes, inputs, inits, outputs = build(d)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(k, DT[t], s) for k, (t, s) in inputs.items()],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    path = os.path.join(work, tag + ".onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    p = run([fsdpc, path, "-o", os.path.join(work, tag), "--target", "cpu", "--eval"], check=False)
    drop(os.path.join(work, tag))  # the model and what was built: only the exit status and message are checked
    return p


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    ops = [op for _, _, rows in gen_ops_md.read_def(open(os.path.join(ROOT, "ir", "ops.def")).read()) for op in rows]
    table, bad = probes(), []
    for op in ops:
        name, cls = op["name"], op["class"]
        if name not in table:
            bad.append("%s: no probe in op_dtypes.py (add one for the new row of ops.def)" % name)
            continue
        ok = set()
        for d in DT:
            p = compile_(fsdpc, work, "%s_%s" % (name, d), table[name], d, max(op["since"], 18))
            lines = p.stderr.strip().splitlines()
            if p.returncode == 0:
                ok.add(d)
            elif p.returncode != 1 or len(lines) != 1:
                bad.append("%s on %s: exit %d with %d lines (expected 0, or 1 and one line): %s"
                           % (name, d, p.returncode, len(lines), p.stderr[-300:]))
            elif d in CLASS[cls]:
                bad.append("%s on %s: refused, but ops.def says %s: %s" % (name, d, cls, lines[0][-200:]))
        if ok - CLASS[cls]:
            bad.append("%s: accepts %s too, beyond ops.def's %s" % (name, ", ".join(sorted(ok - CLASS[cls])), cls))
        print("%-4s %-26s %-9s %s" % ("ok" if ok == CLASS[cls] else "BAD", name, cls, " ".join(sorted(ok))))
    if bad:
        sys.exit("FAILED op_dtypes:\n  " + "\n  ".join(bad))
    print("OK op_dtypes: %d ops x %d dtypes as ops.def says" % (len(ops), len(DT)))


if __name__ == "__main__":
    main()
