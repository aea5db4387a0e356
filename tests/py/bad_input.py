"""Bad input never crashes: each case gets one error line and a non-zero exit.

usage: bad_input.py FSDPC WORKDIR

Covers the compiler (not ONNX, truncated, unsupported ops, dims, external
data, flags, loss names; hostile models: shapes whose element count would
wrap, zero-sized matrices and losses, attributes of the wrong type, names
with control characters, FIFOs as model or external data) and the executable (data files of the wrong
dtype/shape, missing/unknown inputs, truncated .npy, bad flags, a foreign
init file, labels outside the class range), and for both an output that names
an input (refused, the input untouched) or a link planted at an output's name
(replaced, never followed).
"""
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import mpirun, run

failures = []


def expect_error(cmd, *needles, code=(1, 2), world=1, timeout=600, absent=None):
    """one stderr line holding every needle, an exit in code (not a signal),
    within timeout seconds (a hang fails), and no file at absent"""
    try:
        p = run(mpirun(world, cmd), check=False, timeout=timeout)
    except subprocess.TimeoutExpired:
        failures.append("%s: no answer within %ds (hangs)" % (" ".join(cmd[:3]), timeout))
        return
    if absent and os.path.exists(absent):
        failures.append("%s: wrote %s although it failed" % (" ".join(cmd[:3]), absent))
    err = p.stderr.strip()
    lines = [l for l in err.splitlines() if l.strip()]
    name = " ".join(os.path.basename(c) for c in cmd[:3])
    ok = p.returncode in code if world == 1 else p.returncode != 0
    if not ok:
        failures.append("%s: exit %d, expected %s; stderr: %s" % (name, p.returncode, code, err[-500:]))
    elif world == 1 and len(lines) != 1:
        failures.append("%s: %d error lines, expected 1:\n%s" % (name, len(lines), err[-1000:]))
    else:
        miss = [n for n in needles if n not in err]
        if miss:
            failures.append("%s: error lacks %s: %s" % (name, miss, err[-500:]))
        else:
            print("ok  %-60s -> %s" % (" ".join(needles)[:60], lines[0][:150] if lines else ""))


def graph_model(path, nodes, inits, out_shape, x_shape=("batch", 3), out="y", opset=17):
    """x (float, x_shape) -> nodes -> out; inits: name -> numpy array"""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, out_shape)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)


def hostile_models(fsdpc, J, base):
    """Malformed models a fuzzer found: each is one error line naming the node and op (or the file), exit 1,
    no executable, no hang."""
    never = J("never")
    cc = lambda model, *extra: [fsdpc, model, "-o", never, "--target", "cpu"] + list(extra or base)
    w = np.ones((3, 4), np.float32)
    # shapes whose element count wraps int64: Reshape of [3, 4] to [2^62+3, 4], "12" elements modulo 2^64
    graph_model(J("reshape_wrap.onnx"), [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                         helper.make_node("Reshape", ["h", "sh"], ["r"], name="rs"),
                                         helper.make_node("Reshape", ["r", "back"], ["y"])],
                {"w": w, "sh": np.array([2**62 + 3, 4], np.int64), "back": np.array([3, 4], np.int64)}, [None, 4])
    expect_error(cc(J("reshape_wrap.onnx"), "--loss", "mse:y,t", "--dim", "batch=3"), "'rs' (Reshape)", "[4611686018427387907,4]", "2^40", code=(1,),
                 absent=never)
    # a MatMul of a bool and a float, with --verify (the verifier ran before shape inference refused it: an
    # internal error instead of the user's; found by fuzz_compile)
    graph_model(J("matmul_bool.onnx"), [helper.make_node("MatMul", ["x", "wb"], ["y"], name="mmb")],
                {"wb": np.ones((3, 4), np.bool_)}, [None, 4])
    expect_error(cc(J("matmul_bool.onnx"), "--eval", "--verify", "--dim", "batch=2"), "'mmb' (MatMul)", code=(1,),
                 absent=never)
    # an empty tensor whose other dims multiply past 2^62: Pad crops dim 0 to 0 and grows two dims to 2^31+3 (its
    # strides wrapped int64 in codegen: UBSan in fuzz_compile after 206,231 runs); zero dims count as 1 now
    graph_model(J("pad_empty_wide.onnx"), [helper.make_node("Pad", ["x", "pp"], ["y"], name="pd")],
                {"pp": np.array([-1, 2**30, 2**30, -1, 2**30, 2**30], np.int64)}, [None, None, None],
                x_shape=(2, 3, 3))
    expect_error(cc(J("pad_empty_wide.onnx"), "--eval"), "'pd' (Pad)", "[0,2147483651,2147483651]", "2^40",
                 code=(1,), absent=never)
    # the loss reads LayerNormalization's Mean, not Y: its gradient rule took only Y's (-1, an internal error in
    # --verify; found by fuzz_compile after 1,488,719 runs)
    ln = helper.make_node("LayerNormalization", ["x", "lw", "lb"], ["ly", "mean", "isd"], name="ln", axis=-1)
    graph_model(J("ln_mean_loss.onnx"), [ln, helper.make_node("Mul", ["mean", "one"], ["y"])],
                {"lw": np.ones(3, np.float32), "lb": np.zeros(3, np.float32), "one": np.ones(1, np.float32)},
                [None, 1])
    expect_error(cc(J("ln_mean_loss.onnx"), "--loss", "mse:y,t", "--dim", "batch=2", "--verify"),
                 "'ln' (LayerNormalization)", "output 1 ('mean')", code=(1,), absent=never)
    # AveragePool with pads 2^40: 2^41 x 2^41 windows per plane (2^64 elements after N x C)
    pool = helper.make_node("AveragePool", ["x"], ["p"], name="pool", kernel_shape=[1, 1], pads=[2**40] * 4)
    graph_model(J("pool_pads.onnx"), [pool, helper.make_node("Mul", ["p", "s"], ["y"])],
                {"s": np.ones(1, np.float32)}, [None, 1, None, None], x_shape=("batch", 1, 4, 4))
    expect_error(cc(J("pool_pads.onnx")), "'pool' (AveragePool)", "2199023255556", "2^40", code=(1,), absent=never)
    pool = helper.make_node("MaxPool", ["x"], ["y"], name="mp", kernel_shape=[1, 1], pads=[2**62] * 4)
    graph_model(J("pool_pads62.onnx"), [pool], {}, [None, 1, None, None], x_shape=("batch", 1, 4, 4))
    expect_error(cc(J("pool_pads62.onnx")), "'mp' (MaxPool)", "pads", "2^40", code=(1,), absent=never)
    conv = helper.make_node("Conv", ["x", "cw"], ["y"], name="conv", pads=[2**39] * 4, dilations=[2**30, 1])
    graph_model(J("conv_pads.onnx"), [conv], {"cw": np.ones((2, 1, 3, 3), np.float32)}, [None, 2, None, None],
                x_shape=("batch", 1, 4, 4))
    expect_error(cc(J("conv_pads.onnx")), "'conv' (Conv)", "2^40", code=(1,), absent=never)
    # ConvTranspose: output padding of a stride or more, output_shape past a stride's extra, an auto_pad ONNX does
    # not know, SAME_UPPER asking for a negative pad before (3 x 4 outputs of a 3-wide window: 1 short)
    for tag, attrs, needles in (("outpad", dict(strides=[2, 2], output_padding=[2, 0]), ("output_padding", "stride 2")),
                                ("outshape", dict(strides=[2, 2], output_shape=[12, 7]), ("output_shape", "12")),
                                ("autopad", dict(auto_pad="SAME"), ("auto_pad", "SAME_UPPER, SAME_LOWER")),
                                ("autopad_neg", dict(auto_pad="SAME_UPPER", strides=[4, 4]),
                                 ("auto_pad", "negative pad before"))):
        convt = helper.make_node("ConvTranspose", ["x", "cw"], ["y"], name="ct", **attrs)
        graph_model(J("convt_%s.onnx" % tag), [convt], {"cw": np.ones((1, 2, 3, 3), np.float32)},
                    [None, 2, None, None], x_shape=("batch", 1, 3, 3))
        expect_error(cc(J("convt_%s.onnx" % tag)), "'ct' (ConvTranspose)", *needles, code=(1,), absent=never)
    # TopK: K beyond the axis, and an axis too long to rank by pairs (2^14 x 2^13 elements: 2^40 comparisons)
    for tag, xs, k, needles in (("topk_k", ("batch", 3), 4, ("K = 4", "[1, 3]")),
                                ("topk_long", (8192, 16384), 2, ("axis of 16384", "2^26"))):
        graph_model(J("%s.onnx" % tag), [helper.make_node("TopK", ["x", "k"], ["y", "i"], name="tk")],
                    {"k": np.array([k], np.int64)}, None, x_shape=xs)
        expect_error(cc(J("%s.onnx" % tag), "--eval", *(["--dim", "batch=2"] if "batch" in xs else [])),
                     "'tk' (TopK)", *needles, code=(1,), absent=never)
    # 3-D convolutions and pooling (composed of 2-D ops per depth tap, passes/lift3d.c): a kernel of 300 depth taps,
    # depth pads of 2^40 and 2^62, a depth dilation past 2^40, a ConvTranspose's depth stride of 2^40, a
    # MaxPool's Indices, a float64 weight on float32 data
    x3 = ("batch", 1, 4, 4, 4)
    for tag, nd, inits, needles in (
            ("conv3d_taps", helper.make_node("Conv", ["x", "cw"], ["y"], name="c3", pads=[150, 0, 0, 150, 0, 0]),
             {"cw": np.ones((1, 1, 300, 1, 1), np.float32)}, ("'c3' (Conv)", "300", "256 taps")),
            ("pool3d_pads40", helper.make_node("AveragePool", ["x"], ["y"], name="ap3", kernel_shape=[1, 1, 1],
                                               pads=[2**40, 0, 0, 2**40, 0, 0]), {}, ("'ap3' (AveragePool)", "2^40")),
            ("pool3d_pads62", helper.make_node("MaxPool", ["x"], ["y"], name="mp3", kernel_shape=[1, 1, 1],
                                               pads=[2**62] * 6), {}, ("'mp3' (MaxPool)", "pads", "2^40")),
            ("conv3d_dilation", helper.make_node("Conv", ["x", "cw"], ["y"], name="c3", dilations=[2**40, 1, 1]),
             {"cw": np.ones((1, 1, 3, 1, 1), np.float32)}, ("'c3' (Conv)", "dilations", "2^40")),
            ("convt3d_stride", helper.make_node("ConvTranspose", ["x", "cw"], ["y"], name="ct3",
                                                strides=[2**40, 1, 1]),
             {"cw": np.ones((1, 1, 2, 1, 1), np.float32)}, ("'ct3' (ConvTranspose)", "2^40")),
            ("maxpool3d_indices", helper.make_node("MaxPool", ["x"], ["y", "i"], name="mp3", kernel_shape=[2, 2, 2]),
             {}, ("'mp3' (MaxPool)", "Indices", "3-D")),
            ("conv3d_f64_weight", helper.make_node("Conv", ["x", "cw"], ["y"], name="c3"),
             {"cw": np.ones((1, 1, 1, 1, 1), np.float64)}, ("'c3' (Conv)", "dtype f32"))):
        outs = [None] * 5
        if tag == "maxpool3d_indices":
            g = helper.make_graph([nd], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x3))],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, outs),
                                   helper.make_tensor_value_info("i", TensorProto.INT64, outs)])
            onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J(tag + ".onnx"))
        else:
            graph_model(J(tag + ".onnx"), [nd], inits, outs, x_shape=x3)
        expect_error(cc(J(tag + ".onnx"), "--eval", "--dim", "batch=2"), *needles, code=(1,), absent=never)
    # GridSample: a 4-D X (6-D tensor) and a 3-D X with a 2-D grid
    for tag, xs, gs, needles in (("gridsample_4d", (1, 1, 2, 2, 2, 2), (1, 2, 2, 2, 2, 4), ("4-D GridSample", "3-D")),
                                 ("gridsample_grid", (1, 1, 2, 2, 2), (1, 2, 2, 2), ("grid [1,2,2,2]", "3]"))):
        graph_model(J(tag + ".onnx"), [helper.make_node("GridSample", ["x", "gr"], ["y"], name="gs")],
                    {"gr": np.zeros(gs, np.float32)}, None, x_shape=xs, opset=20)
        expect_error(cc(J(tag + ".onnx"), "--eval"), "'gs' (GridSample)", *needles, code=(1,), absent=never)
    # constants a composition would make too large: AffineGrid's 2^40-point grid, EyeLike of 2^40 elements
    for tag, nd, xs, inits, needles in (
            ("affine_big", helper.make_node("AffineGrid", ["x", "s"], ["y"], name="ag"), (1, 2, 3),
             {"s": np.array([1, 1, 2**20, 2**20], np.int64)}, ("'ag' (AffineGrid)", "2^24")),
            ("eye_big", helper.make_node("EyeLike", ["x"], ["y"], name="eye"), (2**20, 2**20), {},
             ("'eye' (EyeLike)", "2^26"))):
        graph_model(J(tag + ".onnx"), [nd], inits, None, x_shape=xs, opset=20)
        expect_error(cc(J(tag + ".onnx"), "--eval"), *needles, code=(1,), absent=never)
    # LSTM: sequence_lens given at run time, an activation fsdpc lacks, W that does not fit hidden_size
    lstm_w = {"w": np.ones((1, 8, 3), np.float32), "r": np.ones((1, 8, 2), np.float32)}
    for tag, ins, attrs, extra, needles in (
            ("lstm_seqlens", ["x", "w", "r", "", "sl"], {}, {}, ("sequence_lens", "not supported")),
            ("lstm_act", ["x", "w", "r"], dict(activations=["HardSigmoid", "Tanh", "Tanh"]), {},
             ("HardSigmoid", "not supported")),
            ("lstm_hidden", ["x", "w", "r"], dict(hidden_size=3), {}, ("hidden_size 3", "[1,8,3]"))):
        g = helper.make_graph([helper.make_node("LSTM", ins, ["y"], name="lstm", hidden_size=attrs.pop("hidden_size", 2),
                                                **attrs)], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 3]),
                               helper.make_tensor_value_info("sl", TensorProto.INT32, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(v, k) for k, v in lstm_w.items()])
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), J(tag + ".onnx"))
        expect_error(cc(J(tag + ".onnx"), "--eval"), "'lstm' (LSTM)", *needles, code=(1,), absent=never)
    # zero-sized dims: a Gemm with a [3, 0] weight, cross-entropy over 0 classes, an empty Conv weight
    graph_model(J("gemm_empty.onnx"), [helper.make_node("Gemm", ["x", "w0"], ["y"], name="g0")],
                {"w0": np.ones((3, 0), np.float32)}, [None, 0])
    expect_error(cc(J("gemm_empty.onnx")), "'g0/MatMul' (MatMul)", "[3,0]", "zero-sized", code=(1,), absent=never)
    graph_model(J("ce_empty.onnx"), [helper.make_node("MatMul", ["x", "w"], ["h"]),
                                     helper.make_node("Slice", ["h", "z", "z", "one"], ["y"], name="cut")],
                {"w": w, "z": np.array([0], np.int64), "one": np.array([1], np.int64)}, [None, 0])
    expect_error(cc(J("ce_empty.onnx"), "--loss", "cross_entropy:y,lab", "--dim", "batch=2"), "CrossEntropyLoss",
                 "[2,0]", "zero-sized", code=(1,), absent=never)
    graph_model(J("conv_empty.onnx"), [helper.make_node("Conv", ["x", "cw"], ["y"], name="c0")],
                {"cw": np.ones((0, 1, 1, 1), np.float32)}, [None, 0, 4, 4], x_shape=("batch", 1, 4, 4))
    expect_error(cc(J("conv_empty.onnx")), "'c0' (Conv)", "[0,1,1,1]", "zero-sized", code=(1,), absent=never)
    # GatherElements indices that would read outside the data: longer off the axis, another rank, a constant
    # index out of range (run-time ones: gradcheck_tensor)
    for tag, idx, needles in (("long", np.zeros((2, 4), np.int64), ("have 4 along dim 1, data 'x' 3", "no longer")),
                              ("rank", np.zeros((2,), np.int64), ("rank 1", "rank 2", "the same rank")),
                              ("const", np.full((2, 3), -3, np.int64), ("index -3 (entry 0 of 'gi')", "[-2, 2)"))):
        graph_model(J("ge_%s.onnx" % tag), [helper.make_node("GatherElements", ["x", "gi"], ["y"], name="ge")],
                    {"gi": idx}, [None, 3])
        expect_error(cc(J("ge_%s.onnx" % tag), "--eval", "--dim", "batch=2"), "node 'ge' (GatherElements)", *needles,
                     code=(1,), absent=never)
    # logical ops of the wrong dtype (fold rewrites them; the user's node is named)
    graph_model(J("and_float.onnx"), [helper.make_node("And", ["x", "x"], ["y"], name="both")], {}, [None, 3])
    expect_error(cc(J("and_float.onnx"), "--eval", "--dim", "batch=2"), "node 'both' (And)", "input 0 is f32",
                 "takes bool", code=(1,), absent=never)
    # ArgMax over an axis longer than its positions are exact; CumSum's axis of another dtype
    graph_model(J("argmax_long.onnx"), [helper.make_node("ArgMax", ["x"], ["y"], name="am", axis=1)], {},
                [None, 1], x_shape=("batch", 2**25))
    expect_error(cc(J("argmax_long.onnx"), "--eval", "--dim", "batch=2"), "node 'am' (ArgMax)", "33554432",
                 "2^24", code=(1,), absent=never)
    graph_model(J("cumsum_axis.onnx"), [helper.make_node("CumSum", ["x", "ax"], ["y"], name="cs")],
                {"ax": np.ones(1, np.float32)}, [None, 3])
    expect_error(cc(J("cumsum_axis.onnx"), "--eval", "--dim", "batch=2"), "node 'cs' (CumSum)", "'ax'",
                 "must be int64", code=(1,), absent=never)
    # scatters: a reduction ONNX does not define, reduction before opset 16, updates of the wrong shape, integer
    # data; GatherND: tuples longer than data's rank, a constant index outside its dim
    sc = lambda op, **a: [helper.make_node(op, ["x", "si", "u"], ["y"], name="sc", **a)]
    for tag, nodes, inits, opset, needles in (
            ("avg", sc("ScatterND", reduction="avg"), {"si": np.zeros((1, 1), np.int64), "u": np.ones((1, 3), np.float32)},
             18, ("'sc' (ScatterND)", "reduction", "avg")),
            ("opset13", sc("ScatterElements", reduction="add"), {"si": np.zeros((1, 3), np.int64),
                                                                  "u": np.ones((1, 3), np.float32)},
             13, ("'sc' (ScatterElements)", "reduction is opset 16's", "opset 13")),
            ("updates", sc("ScatterND"), {"si": np.zeros((2, 1), np.int64), "u": np.ones((3, 3), np.float32)},
             17, ("'sc' (ScatterND)", "updates 'u' have shape [3,3]", "needs [2,3]")),
            ("int", sc("ScatterND"), {"si": np.zeros((1, 1), np.int64), "u": np.ones((1, 3), np.int64)},
             17, ("'sc' (ScatterND)", "updates 'u' is i64", "float32 or float64 only")),
            ("gnd_long", [helper.make_node("GatherND", ["x", "si"], ["y"], name="sc")],
             {"si": np.zeros((1, 3), np.int64)}, 17, ("'sc' (GatherND)", "tuples of 3", "1 to 2")),
            ("gnd_const", [helper.make_node("GatherND", ["x", "si"], ["y"], name="sc")],
             {"si": np.array([[0, 1], [1, -4]], np.int64)}, 17, ("'sc' (GatherND)", "index -4 (entry 3 of 'si')",
                                                                  "[-3, 3)"))):
        graph_model(J("scatter_%s.onnx" % tag), nodes, inits, [None, None], opset=opset)
        expect_error(cc(J("scatter_%s.onnx" % tag), "--eval", "--dim", "batch=2"), *needles, code=(1,), absent=never)
    # mul / max / min set every update against every place: a table beyond 2^26 elements is refused
    graph_model(J("scatter_huge.onnx"), sc("ScatterElements", axis=1, reduction="max"),
                {"si": np.zeros((1, 8192), np.int64), "u": np.ones((1, 8192), np.float32)}, [1, 16384],
                x_shape=(1, 16384), opset=18)
    expect_error(cc(J("scatter_huge.onnx"), "--eval"), "'sc' (ScatterElements)", "134217728 elements", "2^26",
                 code=(1,), absent=never)
    # Resize: an output beyond 2^20 per axis, an opset 18 attribute at opset 17, a mode fsdpc does not know
    rs = lambda **a: [helper.make_node("Resize", ["x", "", "sc"], ["y"], name="rs", **a)]
    for tag, nodes, sc, needles in (
            ("huge", rs(), [1, 2**30], ("dim 1 of size 3", "2^20 per axis")),
            ("axes17", rs(axes=[1]), [2], ("axes is opset 18's", "opset 17")),
            ("mode", rs(mode="bilinear"), [1, 2], ("attribute mode 'bilinear' is not supported", "nearest|linear|cubic"))):
        graph_model(J("resize_%s.onnx" % tag), nodes, {"sc": np.array(sc, np.float32)}, [None, None])
        expect_error(cc(J("resize_%s.onnx" % tag), "--eval", "--dim", "batch=2"), "'rs' (Resize)", *needles,
                     code=(1,), absent=never)
    # Einsum: a diagonal (a subscript repeated in one operand), more operands than inputs
    for tag, eq, needles in (("diag", "ii->i", ("repeats subscript 'i'", "diagonal")),
                             ("operands", "ij,jk->ik", ("more operands", "1 inputs"))):
        graph_model(J("einsum_%s.onnx" % tag), [helper.make_node("Einsum", ["x"], ["y"], name="es", equation=eq)], {},
                    [None], x_shape=(3, 3))
        expect_error(cc(J("einsum_%s.onnx" % tag), "--eval"), "'es' (Einsum)", *needles, code=(1,), absent=never)
    # Attention: below opset 23, opset 25's windows at 24, nonpad_kv_seqlen with a past or not one per batch
    for tag, opset, ins, attrs, needles in (
            ("17", 17, ["x", "x", "x"], {}, ("Attention is an opset 23 op", "opset 17")),
            ("window", 24, ["x", "x", "x"], {"left_window_size": 1}, ("opset 25's", "opset 24")),
            ("nonpad", 24, ["x", "x", "x", "", "x", "x", "len"], {}, ("nonpad_kv_seqlen cannot be combined",)),
            ("nonpad_shape", 24, ["x", "x", "x", "", "", "", "len2"], {}, ("nonpad_kv_seqlen must be", "[1]")),
            ("causal_huge", 23, ["x", "x", "x"], {"is_causal": 1}, ("5000 x 5000 causal", "2^24", "attn_mask"))):
        sq = 5000 if tag == "causal_huge" else 2
        graph_model(J("attention_%s.onnx" % tag), [helper.make_node("Attention", ins, ["y"], name="at", **attrs)],
                    {"len": np.array([2], np.int64), "len2": np.array([2, 2], np.int64)}, [1, 1, sq, 4], x_shape=(1, 1, sq, 4), opset=opset)
        expect_error(cc(J("attention_%s.onnx" % tag), "--eval"), "'at' (Attention)", *needles, code=(1,), absent=never)
    # RotaryEmbedding below opset 23; an odd rotary_embedding_dim
    for tag, opset, attrs, needles in (("17", 17, {}, ("RotaryEmbedding is an opset 23 op",)),
                                       ("odd", 23, {"rotary_embedding_dim": 3}, ("rotary_embedding_dim 3", "even"))):
        graph_model(J("rope_%s.onnx" % tag), [helper.make_node("RotaryEmbedding", ["x", "cs", "cs"], ["y"], name="re",
                                                               **attrs)],
                    {"cs": np.ones((1, 2, 2), np.float32)}, [1, 1, 2, 4], x_shape=(1, 1, 2, 4), opset=opset)
        expect_error(cc(J("rope_%s.onnx" % tag), "--eval"), "'re' (RotaryEmbedding)", *needles, code=(1,), absent=never)
    # opsets: below 7 (lift it with ONNX's converter); an old version's form fsdpc does not read
    # (BatchNormalization-7's spatial 0: per-element statistics)
    graph_model(J("opset6.onnx"), [helper.make_node("Relu", ["x"], ["y"])], {}, [None, 3], opset=6)
    expect_error(cc(J("opset6.onnx"), "--eval"), "opset 6", "opsets 7 to 28", "convert_version", code=(1,),
                 absent=never)
    v3 = np.ones(3, np.float32)
    graph_model(J("bn_spatial0.onnx"), [helper.make_node("BatchNormalization", ["x", "s", "s", "s", "s"], ["y"],
                                                         name="bn", spatial=0)], {"s": v3}, [2, 3], x_shape=(2, 3),
                opset=7)
    expect_error(cc(J("bn_spatial0.onnx"), "--eval"), "'bn' (BatchNormalization)", "spatial = 0", "at opset 7",
                 "convert_version(model, 13)", code=(1,), absent=never)
    # attributes of the wrong type are errors, not silently the default
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"], name="g1")
    gemm.attribute.append(helper.make_attribute("transB", "yes"))
    graph_model(J("attr_str.onnx"), [gemm], {"w": w}, [None, 4])
    expect_error(cc(J("attr_str.onnx")), "node 'g1' (Gemm): attribute 'transB' must be an INT, found STRING",
                 code=(1,), absent=never)
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"], name="g2", alpha=[1, 2])
    graph_model(J("attr_ints.onnx"), [gemm], {"w": w}, [None, 4])
    expect_error(cc(J("attr_ints.onnx")), "node 'g2' (Gemm): attribute 'alpha' must be a FLOAT, found INTS",
                 code=(1,), absent=never)
    # names with a newline and an ANSI escape stay on one line ('?' for each control character)
    gemm = helper.make_node("Gemm", ["x", "w"], ["y\n\x1b[31mred"], name="evil\n\x1b[2Jname")
    gemm.attribute.append(helper.make_attribute("transB", "yes"))
    graph_model(J("attr_evil.onnx"), [gemm], {"w": w}, [None, 4], out="y\n\x1b[31mred")
    expect_error(cc(J("attr_evil.onnx")), "node 'evil??[2Jname' (Gemm)", code=(1,), absent=never)
    graph_model(J("name_evil.onnx"), [helper.make_node("MatMul", ["x", "w"], ["y\n\x1b[31mred"])], {"w": w},
                [None, 4], out="y\n\x1b[31mred")
    expect_error(cc(J("name_evil.onnx"), "--loss", "mse:nope,t", "--dim", "batch=2"), "'nope'", "y??[31mred",
                 code=(1,), absent=never)
    # a FIFO as the model, or as its external data, is refused at once (a hang fails the timeout)
    os.mkfifo(J("fifo.onnx"))
    expect_error(cc(J("fifo.onnx")), "fifo.onnx", "not a regular file", code=(1,), timeout=60, absent=never)
    os.makedirs(J("extfifo"))
    mlp(J("extfifo", "m.onnx"), external=True)
    os.remove(J("extfifo", "w.bin"))
    os.mkfifo(J("extfifo", "w.bin"))
    expect_error(cc(J("extfifo", "m.onnx")), "'w'", "w.bin", "not a regular file", code=(1,), timeout=60,
                 absent=never)
    expect_error(cc(os.path.dirname(never)), "not a regular file", code=(1,), timeout=60, absent=never)


def export_metadata(fsdpc, J, good, base):
    """Exports that would train another network with exit 0, and export_torch.py's padding_idx, non-persistent
    buffer and tied-name metadata gone wrong: one error line each, no executable.  tests/data/export (its generate.py, torch 2.15: CI has no torch 2)
    holds torch.onnx.export's default export of a zero Conv bias, which onnxscript's optimizer drops (as all 26 of
    torchvision's SqueezeNet), and an optimize=False export with a tied embedding and an unused Linear, which
    compiles: a tied parameter is read under its other name and an unused one by nothing, so neither is refused."""
    never = J("never")
    data = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "export")
    cc = lambda model, *extra: [fsdpc, model, "-o", never, "--target", "cpu"] + list(extra)
    dropped = os.path.join(data, "dropped_bias.onnx")
    for extra in ([], ["--params", "*"]):  # naming what to train does not bring the bias back
        expect_error(cc(dropped, "--loss", "mse:y,t", *extra), "dropped_bias.onnx", "parameter 'conv.bias' is",
                     "optimize=False", "do_constant_folding=False", code=(1,), absent=never)
    err = run(cc(dropped, "--loss", "mse:y,t"), check=False).stderr
    if "unused" in err or "more)" in err:
        failures.append("dropped_bias.onnx: the unused Linear's parameters refused too: %s" % err.strip()[:300])
    p = run([fsdpc, os.path.join(data, "tied_unused.onnx"), "-o", J("tied"), "--target", "cpu", "--loss",
             "cross_entropy:y,t", "--report"], check=False)
    if p.returncode != 0 or "): head.weight (1," not in p.stdout:
        failures.append("tied_unused.onnx: exit %d, expected head.weight trained alone: %s"
                        % (p.returncode, (p.stderr + p.stdout).strip()[:300]))
    else:
        print("ok  tied_unused.onnx compiles: head.weight (tied to emb.weight) trained, unused.* not refused")
    # fsdpc.padding_idx.INIT = ROW (scripts/export_torch.py) on the MLP's w [3, 4], read by a MatMul
    for i, (key, val, needles) in enumerate([
            ("nope", "0", ["'nope' is no float initializer of rank 2", "export_torch.py"]),
            ("w", "3", ["padding_idx '3' is no row of 'w' (0..2)"]),
            ("w", "-1", ["padding_idx '-1'"]),
            ("w", "1x", ["padding_idx '1x'"]),
            ("w", "1", ["'w' has a padding_idx (1", "no Gather along its axis 0"])]):
        m = onnx.load(good)
        e = m.metadata_props.add()
        e.key, e.value = "fsdpc.padding_idx." + key, val
        onnx.save(m, J("pad%d.onnx" % i))
        expect_error(cc(J("pad%d.onnx" % i), *base), "pad%d.onnx" % i, *needles, code=(1,), absent=never)
    # export_torch.py's records for --export-safetensors gone wrong: fsdpc.non_persistent.INIT (a non-persistent
    # buffer, left out) naming no initializer; fsdpc.tied.ALIAS = INIT (a tied parameter's other name, written with
    # INIT's data) whose INIT is none, or whose ALIAS is an initializer itself
    for i, (key, val, needles) in enumerate([
            ("fsdpc.non_persistent.rotary.inv_freq", "rotary.inv_freq",
             ["metadata_props 'fsdpc.non_persistent.rotary.inv_freq': 'rotary.inv_freq' is no initializer"]),
            ("fsdpc.tied.head.weight", "nope", ["metadata_props 'fsdpc.tied.head.weight' = 'nope': a tied"]),
            ("fsdpc.tied.w", "w", ["metadata_props 'fsdpc.tied.w' = 'w': a tied", "the name no initializer's"])]):
        m = onnx.load(good)
        e = m.metadata_props.add()
        e.key, e.value = key, val
        onnx.save(m, J("state%d.onnx" % i))
        expect_error(cc(J("state%d.onnx" % i), *base), "state%d.onnx" % i, *needles, "export_torch.py", code=(1,),
                     absent=never)


def mlp(path, extra_nodes=(), external=False, batch="batch"):
    w = numpy_helper.from_array(np.ones((3, 4), np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"])] + list(extra_nodes)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 4])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    if external:
        onnx.save_model(m, path, save_as_external_data=True, location="w.bin", size_threshold=0)
    else:
        onnx.save(m, path)


def snapshot(*paths):
    """path -> its bytes, for every file under paths (a folder: every file in it)"""
    out = {}
    for p in paths:
        files = [os.path.join(p, f) for f in sorted(os.listdir(p))] if os.path.isdir(p) else [p]
        for f in files:
            with open(f, "rb") as h:
                out[f] = h.read()
    return out


def untouched(before, tag):
    """every file of a snapshot is still there with the same bytes, and nothing was added to its folders"""
    for f, data in before.items():
        if not os.path.isfile(f) or open(f, "rb").read() != data:
            failures.append("%s: %s was changed or removed" % (tag, f))
            return
    print("ok  %-60s -> %d victim files untouched" % (tag[:60], len(before)))


def planted(link, target):
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(target, link)


def clobber_compiler(fsdpc, J, good, base):
    """An output that is an input (by identity) is refused before anything is written; a link planted at an
    output's name is replaced, never followed."""
    cpu = ["--target", "cpu"] + base
    keep = snapshot(good)
    expect_error([fsdpc, good, "--report", "--report-json", good] + cpu, "--report-json", "is the model", "good.onnx",
                 code=(1,))
    expect_error([fsdpc, good, "-o", good] + cpu, "-o", "is the model", code=(1,))
    dotted = os.path.join(os.path.dirname(good), ".", os.path.basename(good))  # ./m.onnx vs m.onnx
    expect_error([fsdpc, good, "--report", "--report-json", dotted] + cpu, "--report-json", "is the model", code=(1,))
    os.link(good, J("hard.init"))  # -o hard writes hard.init: a hard link to the model
    expect_error([fsdpc, good, "-o", J("hard")] + cpu, "init file", "hard.init", "is the model", code=(1,),
                 absent=J("hard"))
    os.unlink(J("hard.init"))
    untouched(keep, "compiler: the model named as an output")
    os.mkfifo(J("fifo_out.init"))  # the pair is two files: a FIFO at OUT.init is refused at once, never opened
    expect_error([fsdpc, good, "-o", J("fifo_out")] + cpu, "fifo_out.init is not a regular file", code=(1,),
                 timeout=60, absent=J("fifo_out"))
    os.unlink(J("fifo_out.init"))
    os.makedirs(J("cx"), exist_ok=True)
    mlp(J("cx", "m.onnx"), external=True)
    keep = snapshot(J("cx"))
    expect_error([fsdpc, J("cx", "m.onnx"), "--report", "--report-json", J("cx", "w.bin")] + cpu, "--report-json",
                 "external data file", "w.bin", code=(1,))
    untouched(keep, "compiler: external data named as an output")
    # a link planted at --report-json's name (by anyone who can write the folder): replaced, its target untouched
    with open(J("victim"), "w") as f:
        f.write("precious")
    planted(J("rj.json"), J("victim"))
    keep = snapshot(J("victim"))
    run([fsdpc, good, "--report", "--report-json", J("rj.json")] + cpu)
    untouched(keep, "compiler: --report-json over a planted link")
    if os.path.islink(J("rj.json")) or "strategies" not in open(J("rj.json")).read():
        failures.append("--report-json over a planted link: %s is not the report" % J("rj.json"))


def clobber_executable(fsdpc, exe, J, X):
    """The executable: an output naming one of its inputs (data, its init file, itself) is refused in one line
    before anything is written; links planted at an output's name or its old temporary name are not followed."""
    x, t = J("x.npy"), J("t.npy")
    keep = snapshot(x, t, exe, exe + ".init")
    expect_error([exe, "--export-safetensors", x] + X, "--export-safetensors", "x.npy", "is the --data file",
                 code=(2,))
    expect_error([exe, "--export-onnx", os.path.join(os.path.dirname(t), ".", "t.npy")] + X, "--export-onnx",
                 "is the --data file", code=(2,))
    expect_error([exe, "--metrics", exe + ".init"] + X, "--metrics", "is the init file", code=(2,))
    expect_error([exe, "--export-onnx", exe] + X, "--export-onnx", "this executable", code=(2,))
    expect_error([exe, "--trace", x] + X, "--trace", "is the --data file", code=(2,))
    os.makedirs(J("dg"), exist_ok=True)  # --dump-grads DIR writes DIR/w.npy: here the --data file
    shutil.copy(x, J("dg", "w.npy"))
    keep.update(snapshot(J("dg")))
    expect_error([exe, "--data", "x=" + J("dg", "w.npy"), "--data", "t=" + t, "--steps", "2", "--dump-grads",
                  J("dg")], "--dump-grads", "w.npy", "is the --data file", code=(2,))
    os.makedirs(J("ckx", "step-00000001"), exist_ok=True)  # a --data file inside a checkpoint a save replaces
    shutil.copy(x, J("ckx", "step-00000001", "x.npy"))
    keep.update(snapshot(J("ckx", "step-00000001")))
    expect_error([exe, "--data", "x=" + J("ckx", "step-00000001", "x.npy"), "--data", "t=" + t, "--steps", "2",
                  "--ckpt-dir", J("ckx")], "--ckpt-dir", "holds the --data file", code=(2,))
    untouched(keep, "executable: inputs named as outputs")
    # a forward-only executable: --out-dir DIR writes DIR/y.npy, here its --input file
    ev = J("ev")
    run([fsdpc, J("good.onnx"), "-o", ev, "--target", "cpu", "--eval", "--dim", "batch=8"])
    os.makedirs(J("evo"), exist_ok=True)
    shutil.copy(x, J("evo", "y.npy"))
    keep = snapshot(J("evo"))
    expect_error([ev, "--input", "x=" + J("evo", "y.npy"), "--out-dir", J("evo")], "--out-dir", "y.npy",
                 "is the --input file", code=(2,))
    untouched(keep, "eval: --out-dir onto its --input")
    # links planted at the outputs' names, and at the old temporary name PATH.tmp.<pid> (the shell's pid is the
    # executable's: exec): every output is written, the victim is untouched
    with open(J("victim"), "w") as f:
        f.write("precious")
    keep = snapshot(J("victim"))
    os.makedirs(J("out"), exist_ok=True)
    for name in ("t.st", "m.onnx", "metrics.jsonl"):
        planted(J("out", name), J("victim"))
    cmd = [exe, "--export-safetensors", J("out", "t.st"), "--export-onnx", J("out", "m.onnx"), "--metrics",
           J("out", "metrics.jsonl")] + X
    sh = "for f in t.st m.onnx metrics.jsonl; do ln -s %s %s/$f.tmp.$$; done; exec \"$@\"" % (J("victim"), J("out"))
    p = run(["sh", "-c", sh, "sh"] + cmd, check=False)
    if p.returncode != 0:
        failures.append("outputs over planted links: exit %d: %s" % (p.returncode, p.stderr[-500:]))
    for name in ("t.st", "m.onnx", "metrics.jsonl"):
        f = J("out", name)
        if os.path.islink(f) or not os.path.isfile(f) or os.path.getsize(f) < 16:
            failures.append("outputs over planted links: %s was not written" % f)
    untouched(keep, "executable: outputs over planted links")


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    good = J("good.onnx")
    mlp(good)
    base = ["--loss", "mse:y,t", "--dim", "batch=2"]

    # --- compiler ---------------------------------------------------------
    with open(J("random.onnx"), "wb") as f:
        f.write(np.random.default_rng(0).bytes(3000))
    expect_error([fsdpc, J("random.onnx"), "-o", J("o"), "--target", "cpu"] + base, "random.onnx", "not an ONNX model")
    data = open(good, "rb").read()
    with open(J("trunc.onnx"), "wb") as f:
        f.write(data[: len(data) // 2])
    expect_error([fsdpc, J("trunc.onnx"), "-o", J("o"), "--target", "cpu"] + base, "trunc.onnx")
    expect_error([fsdpc, J("missing.onnx"), "-o", J("o"), "--target", "cpu"] + base, "missing.onnx")
    mlp(J("unsup.onnx"), [helper.make_node("Unique", ["y"], ["s1"], name="sm1"),
                          helper.make_node("Unique", ["s1"], ["s2"], name="sm2"),
                          helper.make_node("MaxUnpool", ["s2", "s2"], ["c"], name="conv")])
    # one short line: each unsupported op with its first node and how many more, and where the accepted ops are
    # listed (not a list of them: that was 1,061 characters)
    expect_error([fsdpc, J("unsup.onnx"), "-o", J("o"), "--target", "cpu"] + base, "unsupported ops",
                 "Unique (node 'sm1' and 1 more)", "MaxUnpool (node 'conv')", "docs/ops.md")
    msg = run([fsdpc, J("unsup.onnx"), "-o", J("o"), "--target", "cpu"] + base, check=False).stderr.strip()
    msg = msg.replace(J("unsup.onnx"), "MODEL")
    if len(msg) > 160 or "Relu" in msg:
        failures.append("unsupported ops: %d characters, expected one short line: %s" % (len(msg), msg[:300]))
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--loss", "mse:y,t", "--dim", "batch=2", "--dim", "seq=4"],
                 "seq", "batch")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--loss", "mse:y,t"], "batch", "--dim")
    os.makedirs(J("ext"))
    mlp(J("ext", "m.onnx"), external=True)
    os.remove(J("ext", "w.bin"))
    expect_error([fsdpc, J("ext", "m.onnx"), "-o", J("o"), "--target", "cpu"] + base, "w.bin", "'w'")
    m = onnx.load(J("ext", "m.onnx"), load_external_data=False)
    m.graph.initializer[0].external_data[0].value = "../good.onnx"
    onnx.save(m, J("ext", "escape.onnx"))
    expect_error([fsdpc, J("ext", "escape.onnx"), "-o", J("o"), "--target", "cpu"] + base, "escapes")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--loss", "mse:nope,t", "--dim", "batch=2"], "nope", "y")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--loss", "mse:y", "--dim", "batch=2"], "--loss", "KIND:PRED,TARGET")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--loss", "hinge:y,t", "--dim", "batch=2"], "hinge")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--optimizer", "lamb"] + base, "lamb", "adamw, adam or sgd")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--wrap", "size:x"] + base, "--wrap")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--frobnicate"] + base, "--frobnicate")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--precision", "fp8"] + base, "--precision fp8")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--reduce-dtype", "fp8"] + base, "--reduce-dtype fp8")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--wrap", "blocks"] + base, "--wrap blocks",
                 "no repeated blocks")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--wrap", "prefix:"] + base, "prefix:A,B")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--wrap", "prefix:fc9"] + base, "'fc9'")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--freeze", "nothing*"] + base, "--freeze 'nothing*'")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--freeze", "*"] + base, "nothing to train")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--params", "nothing*"] + base, "--params 'nothing*'")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--shard", "zero3"] + base, "--shard zero3",
                 "hybrid:F")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--shard", "hybrid:0"] + base, "hybrid:F")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--shard", "hybrid:x"] + base, "hybrid:F")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--precision", "fp8"] + base, "--precision", "fp16")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--reduce-dtype", "fp16"] + base, "--reduce-dtype fp16",
                 "not supported", "bf16")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--eval", "--precision", "bf16", "--dim", "batch=2"],
                 "--eval", "--precision")
    w64 = numpy_helper.from_array(np.ones((3, 4), np.float64), "w")
    g64 = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                            [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 3])],
                            [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 4])], [w64])
    onnx.save(helper.make_model(g64, opset_imports=[helper.make_opsetid("", 17)]), J("f64.onnx"))
    expect_error([fsdpc, J("f64.onnx"), "-o", J("o"), "--target", "cpu", "--precision", "bf16"] + base,
                 "--precision bf16", "float32 model", "f64")
    expect_error([fsdpc, J("f64.onnx"), "-o", J("o"), "--target", "cpu", "--precision", "fp16"] + base,
                 "--precision fp16", "float32 model", "f64")
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--loss", "mse:y,t", "--dim", "batch=0"], "--dim")
    # integers: the flag, the value and the range, never a value cut to int (SIGFPE, or world 2 for 2^32+2)
    rep = [fsdpc, good, "--target", "cpu", "--report"] + base
    expect_error(rep + ["--world", "4294967296"], "--world", "4294967296", "[1, 1048576]", code=(1,))
    expect_error(rep + ["--world", "4294967298"], "--world", "4294967298", "[1, 1048576]", code=(1,))
    expect_error(rep + ["--shard", "hybrid:4294967296"], "hybrid:F", "4294967296", "[1, 1048576]", code=(1,))
    expect_error(rep + ["--max-inflight", "4294967297"], "--max-inflight", "4294967297", "[1, 2147483647]", code=(1,))
    expect_error(rep + ["--wrap", "size:99999999999999999999"], "--wrap size:N", "99999999999999999999", "out of range",
                 code=(1,))
    expect_error(rep + ["--world", "+3"], "--world", "'+3'", "not an integer", code=(1,))
    expect_error([fsdpc, good, "--target", "cpu", "--report", "--loss", "mse:y,t", "--dim",
                  "batch=99999999999999999999"], "--dim batch", "99999999999999999999", "[1, 1099511627776]", code=(1,))
    expect_error(rep + ["--dim", "batch=3"], "--dim batch is given twice", code=(1,))
    # --calibrate: at most one rank per core, and -o checked before it builds or measures anything (--cc /bin/false
    # would fail the build first)
    cal = [fsdpc, "--calibrate", "--cc", "/bin/false"]
    expect_error(cal + ["--world", "99999999999"], "--world", "99999999999", "[1, 1048576]", code=(1,))
    expect_error(cal + ["--world", str(os.cpu_count() + 1)], "--world %d" % (os.cpu_count() + 1), "cores", code=(1,))
    expect_error(cal + ["-o", work], "-o", "not a regular file (a directory)", code=(1,))
    expect_error(cal + ["-o", J("no", "dir", "x.hw")], "no/dir", "does not exist", code=(1,))
    # --hw: a FIFO, a directory are refused at once (a hang fails the timeout)
    os.mkfifo(J("hw.fifo"))
    expect_error(rep + ["--hw", J("hw.fifo")], "--hw", "hw.fifo", "not a regular file (a FIFO)", code=(1,), timeout=60)
    expect_error(rep + ["--hw", work + "/"], "--hw", "not a regular file (a directory)", code=(1,), timeout=60)
    expect_error([fsdpc, good, "-o", J("o"), "--target", "cpu", "--target", "tpu"] + base, "tpu")
    expect_error([fsdpc, good] + base + ["-o"], "-o")
    expect_error([fsdpc, "-o", J("o"), "--target", "cpu"] + base, "no model")
    hostile_models(fsdpc, J, base)
    export_metadata(fsdpc, J, good, base)
    clobber_compiler(fsdpc, J, good, base)

    # --- executable -------------------------------------------------------
    exe = J("train")
    run([fsdpc, good, "-o", exe, "--target", "cpu", "--verify"] + base)
    rng = np.random.default_rng(0)
    np.save(J("x.npy"), rng.standard_normal((8, 3)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((8, 4)).astype(np.float32))
    np.save(J("x64.npy"), rng.standard_normal((8, 3)))
    np.save(J("x5.npy"), rng.standard_normal((8, 5)).astype(np.float32))
    raw = open(J("x.npy"), "rb").read()
    with open(J("xtrunc.npy"), "wb") as f:
        f.write(raw[:-7])
    ok = ["--data", "t=" + J("t.npy"), "--steps", "2"]
    run([exe, "--data", "x=" + J("x.npy")] + ok)  # the good case runs
    expect_error([exe, "--data", "x=" + J("x64.npy")] + ok, "x64.npy", "float64")
    expect_error([exe, "--data", "x=" + J("x5.npy")] + ok, "x5.npy", "3")
    expect_error([exe, "--data", "x=" + J("xtrunc.npy")] + ok, "xtrunc.npy")
    expect_error([exe, "--data", "x=" + J("nofile.npy")] + ok, "nofile.npy")
    expect_error([exe] + ok, "'x'")
    expect_error([exe, "--data", "x=" + J("x.npy"), "--data", "zz=" + J("x.npy")] + ok, "zz")
    expect_error([exe, "--data", "x=" + J("x.npy"), "--bogus"] + ok, "--bogus")
    expect_error([exe, "--data", "x=" + J("x.npy"), "--steps", "-3", "--data", "t=" + J("t.npy")], "--steps")
    expect_error([exe, "--data", "x=" + J("x.npy"), "--lr", "abc"] + ok, "--lr")
    X = ["--data", "x=" + J("x.npy")] + ok
    expect_error([exe, "--accum", "0"] + X, "--accum", code=(2,))
    expect_error([exe, "--steps", "99999999999999999999"] + X, "--steps", "out of range", "[0, 9007199254740992]",
                 code=(2,))
    expect_error([exe, "--trace-steps", "9007199254740993"] + X, "--trace-steps", "[1, 9007199254740992]", code=(2,))
    expect_error([exe, "--seed", "9223372036854775808"] + X, "--seed", "[0, 9223372036854775807]", code=(2,))
    expect_error([exe, "--log-every", "1x"] + X, "--log-every", "'1x'", code=(2,))
    expect_error([exe, "--accum-mode", "locale"] + X, "--accum-mode", "expects comm or local", code=(2,))
    expect_error([exe, "--clip-grad-norm", "-1"] + X, "--clip-grad-norm", code=(2,))
    expect_error([exe, "--export-safetensors", work] + X, "--export-safetensors", "is a directory")
    expect_error([exe, "--export-safetensors", J("no", "dir", "w.safetensors")] + X, "--export-safetensors",
                 "no/dir")
    clobber_executable(fsdpc, exe, J, X)
    expect_error([exe, "--lr-schedule", "step"] + X, "--lr-schedule", "constant, cosine, linear or wsd", code=(2,))
    expect_error([exe, "--decay-steps", "5"] + X, "--lr-schedule cosine, linear or wsd", code=(2,))
    expect_error([exe, "--wsd-decay-steps", "2"] + X, "--lr-schedule wsd", code=(2,))
    expect_error([exe, "--lr-schedule", "wsd", "--wsd-decay-steps", "9", "--steps", "6"] + X, "--wsd-decay-steps 9",
                 "longer", code=(2,))
    expect_error([exe, "--lr-schedule", "cosine", "--warmup-steps", "4"] + X, "--warmup-steps 4", "--decay-steps",
                 code=(2,))
    # loss-scale flags: fp16 builds only, positive, one of static / dynamic
    expect_error([exe, "--loss-scale-init", "1024"] + X, "--loss-scale-init", "--precision fp16", code=(2,))
    exe16 = J("train16")
    run([fsdpc, good, "-o", exe16, "--target", "cpu", "--precision", "fp16"] + base)
    run([exe16, "--loss-scale-init", "1024", "--loss-scale-growth-interval", "3"] + X)  # the good case runs
    expect_error([exe16, "--loss-scale-init", "0"] + X, "--loss-scale-init", "(0, 2^126]", code=(2,))
    expect_error([exe16, "--loss-scale", "1e300"] + X, "--loss-scale", "(0, 2^126]", code=(2,))
    expect_error([exe16, "--loss-scale-growth-interval", "0"] + X, "--loss-scale-growth-interval", code=(2,))
    expect_error([exe16, "--loss-scale", "8", "--loss-scale-init", "8"] + X, "--loss-scale S", "one or the other",
                 code=(2,))
    other = J("other")
    mlp(J("other.onnx"))
    m = onnx.load(J("other.onnx"))
    m.graph.initializer[0].raw_data = np.full((3, 4), 2, np.float32).tobytes()
    onnx.save(m, J("other.onnx"))
    # another structure (--optimizer sgd: another step): other weights of this one would fit (init_pair (f))
    run([fsdpc, J("other.onnx"), "-o", other, "--target", "cpu", "--optimizer", "sgd"] + base)
    expect_error([exe, "--data", "x=" + J("x.npy"), "--init", other + ".init"] + ok, "other.init")

    # labels outside the class range: a run-time error naming step and rank
    ce = J("ce")
    run([fsdpc, good, "-o", ce, "--target", "cpu", "--loss", "cross_entropy:y,lab", "--dim", "batch=2"])
    np.save(J("lab.npy"), np.array([0, 1, 2, 3, 1, 7, 0, 0], np.int64))
    expect_error([ce, "--data", "x=" + J("x.npy"), "--data", "lab=" + J("lab.npy"), "--steps", "3"],
                 "step 3", "rank 0", "label 7")
    expect_error([ce, "--data", "x=" + J("x.npy"), "--data", "lab=" + J("lab.npy"), "--steps", "3"],
                 "step 2", "rank 0", "label 7", world=2)
    if failures:
        raise SystemExit("FAILED:\n  " + "\n  ".join(failures))
    print("OK bad_input")


if __name__ == "__main__":
    main()
