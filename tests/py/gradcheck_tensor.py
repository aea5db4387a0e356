"""The tensor family's gradient rules against central finite differences, in float64.

usage: gradcheck_tensor.py FSDPC WORKDIR [CASE...]

Same method as gradcheck.py (whose helpers this imports): each case is a small
float64 graph whose float initializers are trained; the executable's loss at
w0 is checked against NumPy, its gradient (w0 - w1 after one SGD step with lr
1) against (L(w0 + h d) - L(w0 - h d)) / 2h along random directions d.
Integer and bool initializers (indices, conditions, slice bounds) are
constants.

Forward-only cases (--eval against NumPy, exact) cover what ONNX's node tests
leave out at opsets 13-17 (Not, ConstantOfShape, Range and Trilu have no
case there) and the run-time paths of folding-sized ops: outputs above
fold's limit, integer Pad by strided copies, int32 / bool inputs that fold
casts to int64, int64 arithmetic, indices of GatherND / ScatterND /
ScatterElements given at run time.

Then the shape arithmetic torch.onnx emits for x.view(B, T, nh, hs)
(Shape -> Gather -> Div -> Unsqueeze -> Concat -> Reshape) must fold away:
after `--dump-after fold` no Shape, Gather, Unsqueeze or Concat node is
left, for a parameter and for a graph input whose dims are bound by --dim;
the latter also runs (--eval) against NumPy.  Last, a shape-deciding input
that is not a constant is one error line naming the node, op and input, and
a GatherElements, ScatterElements or GatherND index a run brings outside the
data, or an integer division by zero, fails the step with one line naming
the node, the index (or position) and the input.
"""
import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from onnx.backend.test.case.node import resize as onnx_resize  # ONNX's reference Resize

from common import check, run
from gradcheck import NEWER_OPS, check_case, r

I64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)


def node(op, ins, outs, **attrs):
    return helper.make_node(op, ins, outs, **attrs)


def slice_ref(a, starts, ends, axes, steps):
    idx = [slice(None)] * a.ndim
    for s, e, ax, st in zip(starts, ends, axes, steps):
        idx[ax] = slice(s, None if e < -a.shape[ax] else e, st)
    return a[tuple(idx)]


def trilu_ref(a, upper, k):
    return np.triu(a, k) if upper else np.tril(a, k)


def cumsum_ref(a, axis, exclusive=0, reverse=0):
    b = np.flip(a, axis) if reverse else a
    y = np.cumsum(b, axis) - (b if exclusive else 0)
    return np.flip(y, axis) if reverse else y


def cumprod_ref(a, axis, exclusive=0, reverse=0):
    b = np.flip(a, axis) if reverse else a
    if exclusive:  # ones shifted in
        pad = [(0, 0)] * b.ndim
        pad[axis] = (1, 0)
        b = np.take(np.pad(b, pad, constant_values=1), range(b.shape[axis]), axis)
    y = np.cumprod(b, axis)
    return np.flip(y, axis) if reverse else y


def topk_ref(a, k, axis, largest=True):
    """values and indices of the k largest (smallest) along axis, ties to the lower index (no NaN)"""
    order = np.argsort(-a if largest else a, axis=axis, kind="stable")
    idx = np.take(order, np.arange(k), axis=axis)
    return np.take_along_axis(a, idx, axis), idx


def arg_ref(fn, a, axis, last=0, keepdims=1):
    """np.argmax / argmin (the first NaN wins, as in torch); last: the last of equal values"""
    y = a.shape[axis] - 1 - fn(np.flip(a, axis), axis) if last else fn(a, axis)
    return np.expand_dims(y, axis) if keepdims else y


def attention_ref(q, k, v, mask=None, causal=0, scale=None, past=None, softcap=0.0, lw=-1, rw=-1, heads=None,
                  nonpad=None):
    """ONNX Attention written out: heads, past, grouped heads, scale, softcap, causal/window/mask bias, rows
    whose bias is all -inf give zeros; nonpad: each batch's valid keys, the query block ending at the last one"""
    if heads:
        split = lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1).transpose(0, 2, 1, 3)
        q, k, v = split(q, heads[0]), split(k, heads[1]), split(v, heads[1])
    if past:
        k, v = np.concatenate([past[0], k], 2), np.concatenate([past[1], v], 2)
    rep = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, rep, 1), np.repeat(v, rep, 1)
    s = (q * (scale or 1 / np.sqrt(q.shape[-1]))) @ k.swapaxes(-1, -2)
    if softcap > 0:
        s = softcap * np.tanh(s / softcap)
    i = np.arange(s.shape[-2])[:, None] + (past[0].shape[2] if past else 0)
    j = np.arange(s.shape[-1])[None, :]
    ok = np.ones(s.shape[-2:], bool)
    if nonpad is not None:  # per batch: [B, 1, sq, skv]
        i = i + (nonpad - s.shape[-2]).reshape(-1, 1, 1, 1)
        ok = j < nonpad.reshape(-1, 1, 1, 1)
    ok = ok & (j <= i) if causal else ok
    ok = ok & (i - j <= lw) if lw >= 0 else ok
    ok = ok & (j - i <= rw) if rw >= 0 else ok
    bias = np.where(ok, 0.0, -np.inf)
    if mask is not None:
        mb = np.where(mask, 0.0, -np.inf) if mask.dtype == np.bool_ else mask
        mb = np.pad(mb, [(0, 0)] * (mb.ndim - 1) + [(0, s.shape[-1] - mb.shape[-1])], constant_values=-np.inf)
        bias = bias + mb
    full = np.isneginf(bias.max(-1, keepdims=True))
    s = np.where(full, 0.0, s + bias)
    e = np.exp(s - s.max(-1, keepdims=True))
    y = np.where(full, 0.0, e / e.sum(-1, keepdims=True)) @ v
    return y.transpose(0, 2, 1, 3).reshape(y.shape[0], y.shape[2], -1) if heads else y


def rope_ref(x, cos, sin, pos=None, il=0, rd=0, heads=None):
    """ONNX RotaryEmbedding written out: rotate the first rd of each head by the angles' cos/sin, pairs being
    halves or (il) neighbours"""
    x4 = x.reshape(x.shape[0], x.shape[1], heads, -1) if heads else x.transpose(0, 2, 1, 3)  # B, S, H, D
    if pos is not None:
        cos, sin = cos[pos], sin[pos]
    rd = rd or x4.shape[-1]
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    rot = x4[..., :rd]
    a, b = (rot[..., 0::2], rot[..., 1::2]) if il else (rot[..., :rd // 2], rot[..., rd // 2:])
    re, im = c * a - s * b, s * a + c * b
    out = np.stack([re, im], -1).reshape(rot.shape) if il else np.concatenate([re, im], -1)
    y = np.concatenate([out, x4[..., rd:]], -1)
    return y.reshape(x.shape) if heads else y.transpose(0, 2, 1, 3)


# name: (nodes, weights, forward(w) -> Y)
REDUCE = {0: lambda a, b: b, 1: lambda a, b: a + b, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def scatter_nd_ref(d, idx, u, add):
    """ONNX ScatterND (reduction none, add, "mul", "max" or "min"), row by row in index order"""
    y, f = d.copy(), REDUCE[add]
    for t in np.ndindex(idx.shape[:-1]):
        p = tuple(int(v) for v in idx[t])
        y[p] = f(y[p], u[t])
    return y


def scatter_elements_ref(d, idx, u, axis, add):
    """ONNX ScatterElements (reduction none, add, "mul", "max" or "min"), element by element in index order"""
    y, f = d.copy(), REDUCE[add]
    for m in np.ndindex(idx.shape):
        p = list(m)
        p[axis] = int(idx[m])
        p = tuple(p)
        y[p] = f(y[p], u[m])
    return y


def cases():
    c = {}
    c["Concat"] = ([node("Concat", ["A", "B", "C"], ["Y"], axis=1)], {"A": r(2, 3), "B": r(2, 2), "C": r(2, 1)},
                   lambda w: np.concatenate([w["A"], w["B"], w["C"]], 1))
    many = {"X%d" % i: r(1, 2) for i in range(10)}  # > 8 inputs: fold nests it
    c["Concat_10_inputs"] = ([node("Concat", list(many), ["Y"], axis=-2)], many,
                             lambda w: np.concatenate([w["X%d" % i] for i in range(10)], 0))
    c["Split_all_used"] = ([node("Split", ["A", "sp"], ["a", "b", "c"], axis=0),
                            node("Concat", ["c", "a", "b"], ["Y"], axis=0)],
                           {"A": r(6, 4), "sp": I64("sp", [1, 2, 3])},
                           lambda w: np.concatenate([w["A"][3:], w["A"][:1], w["A"][1:3]], 0))
    c["Split_one_unused"] = ([node("Split", ["A"], ["a", "b", "c"], axis=1),
                              node("Mul", ["a", "K"], ["ak"]), node("Concat", ["ak", "c"], ["Y"], axis=1)],
                             {"A": r(3, 6), "K": r(3, 2)},
                             lambda w: np.concatenate([w["A"][:, :2] * w["K"], w["A"][:, 4:]], 1))
    sl = ([1, -1, 0], [4, -100, 4], [0, 1, 2], [2, -2, 1])
    c["Slice_neg_steps"] = ([node("Slice", ["A", "st", "en", "ax", "sp"], ["Y"])],
                            {"A": r(5, 6, 4), "st": I64("st", sl[0]), "en": I64("en", sl[1]),
                             "ax": I64("ax", sl[2]), "sp": I64("sp", sl[3])},
                            lambda w: slice_ref(w["A"], *sl))
    c["Slice_default_axes"] = ([node("Slice", ["A", "st", "en"], ["Y"])],
                               {"A": r(4, 5), "st": I64("st", [1, -3]), "en": I64("en", [3, 1000])},
                               lambda w: w["A"][1:3, -3:])
    ids = np.array([[1, 3, 3], [0, 9, 1]])
    c["Gather_embedding"] = ([node("Gather", ["E", "ids"], ["Y"])], {"E": r(10, 4), "ids": I64("ids", ids)},
                             lambda w: w["E"][ids])
    c["Gather_axis1_negative"] = ([node("Gather", ["E", "ids"], ["Y"], axis=1)],
                                  {"E": r(3, 5), "ids": I64("ids", [-1, 2, 2, 0])},
                                  lambda w: w["E"][:, [4, 2, 2, 0]])
    gi0 = np.array([[0, -1, 3, 2, 2], [1, 1, -4, 0, 3], [3, 0, 0, -2, 1], [2, 2, 1, 1, -1], [0, 3, 2, 0, 0],
                    [-3, 1, 0, 3, 2]])  # 6 x 5 into 4 x 5: repeats, negatives
    gi1 = np.array([[5, -6, 0, 5], [2, 2, -1, 3]])  # 2 x 4 into 3 x 6: shorter than A off the axis
    c["GatherElements_axis0"] = ([node("GatherElements", ["A", "ge"], ["Y"])], {"A": r(4, 5), "ge": I64("ge", gi0)},
                                 lambda w: np.take_along_axis(w["A"], gi0 % 4, axis=0))
    c["GatherElements_axis1_short"] = ([node("GatherElements", ["A", "ge"], ["Y"], axis=-1)],
                                       {"A": r(3, 6), "ge": I64("ge", gi1)},
                                       lambda w: np.take_along_axis(w["A"][:2], gi1 % 6, axis=1))
    gn1 = np.array([[[1], [3], [1]], [[0], [-2], [2]]])  # batch_dims 1: rows of each batch, repeated
    c["GatherND_batch_dims1"] = ([node("GatherND", ["A", "gn"], ["Y"], batch_dims=1)],
                                 {"A": r(2, 4, 3), "gn": I64("gn", gn1)},
                                 lambda w: np.stack([w["A"][b][gn1[b, :, 0]] for b in range(2)]))
    gn2 = np.array([[[0, 1], [2, -1]], [[0, 1], [-3, 2]]])  # tuples of 2 into 3 x 4, one repeated
    c["GatherND_tuples"] = ([node("GatherND", ["A", "gn"], ["Y"])], {"A": r(3, 4, 2), "gn": I64("gn", gn2)},
                            lambda w: w["A"][gn2[..., 0], gn2[..., 1]])
    sn1 = np.array([[1], [3], [1], [-1]])  # rows, one repeated: added twice
    c["ScatterND_add_rows"] = ([node("ScatterND", ["D", "sn", "U"], ["Y"], reduction="add")],
                               {"D": r(5, 3), "U": r(4, 3), "sn": I64("sn", sn1)},
                               lambda w: scatter_nd_ref(w["D"], sn1 % 5, w["U"], 1))
    sn2 = np.array([[0, 1], [2, 3], [-1, 0]])  # single elements of 3 x 4, unique
    c["ScatterND_none_elements"] = ([node("ScatterND", ["D", "sn", "U"], ["Y"])],
                                    {"D": r(3, 4), "U": r(3), "sn": I64("sn", sn2)},
                                    lambda w: scatter_nd_ref(w["D"], sn2 % [3, 4], w["U"], 0))
    se1 = np.array([[0, 4, -1, 2], [2, 2, 0, -5]])  # 2 x 4 into 3 x 5 along axis 1: repeats
    c["ScatterElements_add_axis1"] = ([node("ScatterElements", ["D", "se", "U"], ["Y"], axis=1, reduction="add")],
                                      {"D": r(3, 5), "U": r(2, 4), "se": I64("se", se1)},
                                      lambda w: scatter_elements_ref(w["D"], se1 % 5, w["U"], 1, 1))
    se0 = np.array([[3, 0, 1], [-4, 2, 3]])  # unique in each column
    c["ScatterElements_none_axis0"] = ([node("ScatterElements", ["D", "se", "U"], ["Y"])],
                                       {"D": r(4, 3), "U": r(2, 3), "se": I64("se", se0)},
                                       lambda w: scatter_elements_ref(w["D"], se0 % 4, w["U"], 0, 0))
    # max / min: repeated indices (the largest / smallest update wins), positions no update reaches keep data
    c["ScatterElements_max_axis1"] = ([node("ScatterElements", ["D", "se", "U"], ["Y"], axis=1, reduction="max")],
                                      {"D": r(3, 5), "U": r(2, 4), "se": I64("se", se1)},
                                      lambda w: scatter_elements_ref(w["D"], se1 % 5, w["U"], 1, "max"))
    c["ScatterElements_min_axis0"] = ([node("ScatterElements", ["D", "se", "U"], ["Y"], reduction="min")],
                                      {"D": r(4, 3), "U": r(2, 3), "se": I64("se", np.array([[3, 0, 3], [-1, 0, 1]]))},
                                      lambda w: scatter_elements_ref(w["D"], np.array([[3, 0, 3], [3, 0, 1]]),
                                                                     w["U"], 0, "min"))
    c["ScatterND_max_rows"] = ([node("ScatterND", ["D", "sn", "U"], ["Y"], reduction="max")],
                               {"D": r(5, 3), "U": r(4, 3), "sn": I64("sn", sn1)},
                               lambda w: scatter_nd_ref(w["D"], sn1 % 5, w["U"], "max"))
    c["ScatterND_min_elements"] = ([node("ScatterND", ["D", "sn", "U"], ["Y"], reduction="min")],
                                   {"D": r(3, 4), "U": r(3), "sn": I64("sn", sn2)},
                                   lambda w: scatter_nd_ref(w["D"], sn2 % [3, 4], w["U"], "min"))
    # mul: repeated indices multiply in; an update of 0 (the product of the others is its gradient, not y / u)
    uz = r(2, 4)
    uz[1, 1] = 0  # it and uz[1, 0] land on (1, 2)
    c["ScatterElements_mul_axis1"] = ([node("ScatterElements", ["D", "se", "U"], ["Y"], axis=1, reduction="mul")],
                                      {"D": r(3, 5), "U": uz, "se": I64("se", se1)},
                                      lambda w: scatter_elements_ref(w["D"], se1 % 5, w["U"], 1, "mul"))
    c["ScatterND_mul_rows"] = ([node("ScatterND", ["D", "sn", "U"], ["Y"], reduction="mul")],
                               {"D": r(5, 3), "U": r(4, 3), "sn": I64("sn", sn1)},
                               lambda w: scatter_nd_ref(w["D"], sn1 % 5, w["U"], "mul"))
    # TopK: the values' gradient scatters back to the positions picked (GatherElements'); the indices are not
    # differentiated
    c["TopK_axis1_k3"] = ([node("TopK", ["A", "K"], ["Y", "I"], axis=1)], {"A": r(3, 6, 2), "K": I64("K", [3])},
                          lambda w: topk_ref(w["A"], 3, 1)[0])
    c["TopK_smallest_last_axis"] = ([node("TopK", ["A", "K"], ["Y", "I"], largest=0)],
                                    {"A": r(4, 5), "K": I64("K", [2])}, lambda w: topk_ref(w["A"], 2, 1, False)[0])
    c["CumSum_len7"] = ([node("CumSum", ["A", "ax"], ["Y"])], {"A": r(3, 7), "ax": I64("ax", 1)},
                        lambda w: cumsum_ref(w["A"], 1))
    c["CumSum_reverse_exclusive"] = ([node("CumSum", ["A", "ax"], ["Y"], exclusive=1, reverse=1)],
                                     {"A": r(5, 2, 3), "ax": I64("ax", -3)},
                                     lambda w: cumsum_ref(w["A"], 0, 1, 1))
    c["CumSum_exclusive_len8"] = ([node("CumSum", ["A", "ax"], ["Y"], exclusive=1)],
                                  {"A": r(2, 8), "ax": numpy_helper.from_array(np.array([-1], np.int32), "ax")},
                                  lambda w: cumsum_ref(w["A"], 1, 1))
    # CumProd (opset 26): plain, exclusive and reverse; a zero in the input (the product's gradient there)
    c["CumProd_len7"] = ([node("CumProd", ["A", "ax"], ["Y"])], {"A": r(3, 7), "ax": I64("ax", 1)},
                         lambda w: cumprod_ref(w["A"], 1))
    c["CumProd_reverse_exclusive"] = ([node("CumProd", ["A", "ax"], ["Y"], exclusive=1, reverse=1)],
                                      {"A": r(5, 2, 3), "ax": I64("ax", 0)}, lambda w: cumprod_ref(w["A"], 0, 1, 1))
    az = r(2, 6)
    az[0, 2] = 0
    c["CumProd_zero"] = ([node("CumProd", ["A", "ax"], ["Y"])], {"A": az, "ax": I64("ax", -1)},
                         lambda w: cumprod_ref(w["A"], 1))
    # Einsum against np.einsum: implicit output, ellipses broadcasting, Mul (no summed label) and MatMul paths,
    # three operands, a single operand summed and transposed, a full contraction to a scalar
    ein = lambda eq, ins, out="Y": node("Einsum", ins, [out], equation=eq)
    c["Einsum_batch_matmul_implicit"] = ([ein("bij, bjk", ["A", "B"])], {"A": r(2, 3, 4), "B": r(2, 4, 5)},
                                         lambda w: np.einsum("bij,bjk", w["A"], w["B"]))
    c["Einsum_ellipsis_broadcast"] = ([ein("...ij,...jk->...ik", ["A", "B"])], {"A": r(2, 1, 3, 4), "B": r(3, 4, 2)},
                                      lambda w: np.einsum("...ij,...jk->...ik", w["A"], w["B"]))
    c["Einsum_attention_scores"] = ([ein("bhqd,bhkd->bhqk", ["A", "B"])], {"A": r(1, 2, 3, 4), "B": r(1, 2, 5, 4)},
                                    lambda w: np.einsum("bhqd,bhkd->bhqk", w["A"], w["B"]))
    c["Einsum_hadamard_outer"] = ([ein("ij,ij->ji", ["A", "B"], "h"), ein("i,j->ji", ["U", "V"], "o"),
                                   node("Add", ["h", "o"], ["Y"])], {"A": r(3, 4), "B": r(3, 4), "U": r(3), "V": r(4)},
                                  lambda w: (w["A"] * w["B"]).T + np.outer(w["U"], w["V"]).T)
    c["Einsum_three_operands"] = ([ein("ij,jk,kl->il", ["A", "B", "C"])], {"A": r(2, 3), "B": r(3, 4), "C": r(4, 2)},
                                  lambda w: w["A"] @ w["B"] @ w["C"])
    c["Einsum_sum_transpose_scalar"] = ([ein("ijk->kj", ["A"], "t"), ein("Ab,bA", ["P", "Q"], "z"),
                                         node("Mul", ["t", "z"], ["Y"])],
                                        {"A": r(2, 3, 4), "P": r(2, 3), "Q": r(3, 2)},
                                        lambda w: w["A"].sum(0).T * np.einsum("Ab,bA", w["P"], w["Q"]))
    # Attention (read at opset 25) against attention_ref
    att = lambda ins, **a: node("Attention", ins, ["Y"], **a)
    c["Attention_causal_grouped_heads"] = ([att(["Q", "K", "V"], is_causal=1)],
                                           {"Q": r(2, 4, 3, 4), "K": r(2, 2, 3, 4), "V": r(2, 2, 3, 5)},
                                           lambda w: attention_ref(w["Q"], w["K"], w["V"], causal=1))
    c["Attention_3d_float_mask_softcap"] = (
        [att(["Q", "K", "V", "M"], q_num_heads=2, kv_num_heads=2, softcap=2.5, scale=0.375)],
        {"Q": r(2, 3, 8), "K": r(2, 5, 8), "V": r(2, 5, 6), "M": r(3, 5)},
        lambda w: attention_ref(w["Q"], w["K"], w["V"], w["M"], scale=0.375, softcap=2.5, heads=(2, 2)))
    bm = np.array([[True, False, True, True], [False, False, False, False], [True, True, False, True]])
    c["Attention_bool_mask_masked_row_past_window"] = (
        [att(["Q", "K", "V", "bm", "PK", "PV"], is_causal=1, left_window_size=2)],
        {"Q": r(1, 2, 3, 4), "K": r(1, 1, 3, 4), "V": r(1, 1, 3, 2), "PK": r(1, 1, 2, 4), "PV": r(1, 1, 2, 2),
         "bm": numpy_helper.from_array(bm, "bm")},
        lambda w: attention_ref(w["Q"], w["K"], w["V"], bm, causal=1, lw=2, past=(w["PK"], w["PV"])))
    lens = np.array([5, 2])  # batch 1: 2 keys for 3 queries, its first row masked whole
    c["Attention_nonpad_causal_window_grouped"] = (
        [att(["Q", "K", "V", "", "", "", "lens"], is_causal=1, left_window_size=3)],
        {"Q": r(2, 2, 3, 4), "K": r(2, 1, 5, 4), "V": r(2, 1, 5, 3), "lens": I64("lens", lens)},
        lambda w: attention_ref(w["Q"], w["K"], w["V"], causal=1, lw=3, nonpad=lens))
    # RotaryEmbedding (opset 23) against rope_ref; the caches are trained too
    pos = np.array([[2, 0, 1], [1, 1, 3]])
    c["RotaryEmbedding_4d_position_ids"] = (
        [node("RotaryEmbedding", ["X", "C", "S", "pos"], ["Y"])],
        {"X": r(2, 2, 3, 4), "C": r(4, 2), "S": r(4, 2), "pos": I64("pos", pos)},
        lambda w: rope_ref(w["X"], w["C"], w["S"], pos))
    c["RotaryEmbedding_3d_interleaved_partial"] = (
        [node("RotaryEmbedding", ["X", "C", "S"], ["Y"], interleaved=1, rotary_embedding_dim=4, num_heads=2)],
        {"X": r(1, 3, 12), "C": r(1, 3, 2), "S": r(1, 3, 2)},
        lambda w: rope_ref(w["X"], w["C"], w["S"], il=1, rd=4, heads=2))
    # Resize against ONNX's reference (onnx.backend.test.case.node.resize), read at opset 19
    F = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.float32), name)
    c["Resize_nearest_scales"] = ([node("Resize", ["A", "", "sc"], ["Y"])],
                                  {"A": r(1, 2, 3, 4), "sc": F("sc", [1, 1, 2, 1.5])},
                                  lambda w: onnx_resize.interpolate_nd(w["A"], onnx_resize.nearest_coeffs,
                                                                       scale_factors=[1, 1, 2, 1.5]))
    c["Resize_linear_align_corners_sizes"] = (
        [node("Resize", ["A", "", "", "sz"], ["Y"], mode="linear", coordinate_transformation_mode="align_corners")],
        {"A": r(1, 1, 4, 5), "sz": I64("sz", [1, 1, 3, 7])},
        lambda w: onnx_resize.interpolate_nd(w["A"], onnx_resize.linear_coeffs, output_size=[1, 1, 3, 7],
                                             coordinate_transformation_mode="align_corners"))
    c["Resize_cubic_exclude_outside_axes"] = (
        [node("Resize", ["A", "", "", "sz"], ["Y"], mode="cubic", exclude_outside=1, cubic_coeff_a=-0.5, axes=[-2])],
        {"A": r(2, 6, 3), "sz": I64("sz", [4])},
        lambda w: onnx_resize.interpolate_nd(w["A"], lambda t: onnx_resize.cubic_coeffs(t, A=-0.5),
                                             output_size=[2, 4, 3], exclude_outside=True))
    # half_pixel_symmetric (opset 19; not in this reference): 5 -> 2.5 -> 2 gives adjustment 0.8, offset 0.5,
    # so output o reads input 2o + 1 exactly
    c["Resize_linear_half_pixel_symmetric"] = (
        [node("Resize", ["A", "", "sc"], ["Y"], mode="linear", coordinate_transformation_mode="half_pixel_symmetric",
              axes=[1])], {"A": r(2, 5), "sc": F("sc", [0.5])}, lambda w: w["A"][:, [1, 3]])
    c["Expand"] = ([node("Expand", ["A", "sh"], ["Y"])], {"A": r(3, 1), "sh": I64("sh", [2, 1, 4])},
                   lambda w: np.broadcast_to(w["A"], (2, 3, 4)))
    c["Tile"] = ([node("Tile", ["A", "rep"], ["Y"])], {"A": r(2, 3), "rep": I64("rep", [2, 3])},
                 lambda w: np.tile(w["A"], (2, 3)))
    pads = [2, 1, 1, 3]  # begins of dims 0, 1, then ends
    npw = ((2, 1), (1, 3))
    val = numpy_helper.from_array(np.array(0.5), "val")
    c["Pad_constant"] = ([node("Pad", ["A", "pads", "val"], ["Y"], mode="constant")],
                         {"A": r(3, 5), "pads": I64("pads", pads), "val": val},
                         lambda w: np.pad(w["A"], npw, constant_values=0.5))
    c["Pad_constant_crop"] = ([node("Pad", ["A", "pads"], ["Y"])], {"A": r(3, 5), "pads": I64("pads", [1, -1, 0, 2])},
                              lambda w: np.pad(w["A"][:, 1:], ((1, 0), (0, 2))))
    for mode in ("reflect", "edge"):
        c["Pad_" + mode] = ([node("Pad", ["A", "pads"], ["Y"], mode=mode)], {"A": r(3, 5), "pads": I64("pads", pads)},
                            (lambda m: lambda w: np.pad(w["A"], npw, mode=m))(mode))
    cond = rng_bool((3, 4))
    c["Where_broadcast"] = ([node("Where", ["cond", "A", "B"], ["Y"])],
                            {"A": r(3, 4), "B": r(4), "cond": numpy_helper.from_array(cond, "cond")},
                            lambda w: np.where(cond, w["A"], w["B"]))
    c["Cast_f64_chain"] = ([node("Cast", ["A"], ["a"], to=TensorProto.DOUBLE), node("Mul", ["a", "K"], ["m"]),
                            node("Cast", ["m"], ["Y"], to=TensorProto.DOUBLE)],
                           {"A": r(3, 4), "K": r(3, 4)}, lambda w: w["A"] * w["K"])
    c["Squeeze_Unsqueeze_Flatten"] = ([node("Squeeze", ["A", "ax1"], ["s"]), node("Unsqueeze", ["s", "ax03"], ["u"]),
                                       node("Flatten", ["u"], ["f"], axis=2), node("Mul", ["f", "K"], ["Y"])],
                                      {"A": r(3, 1, 4), "K": r(3, 4), "ax1": I64("ax1", [1]),
                                       "ax03": I64("ax03", [0, -1])},
                                      lambda w: w["A"].reshape(3, 4) * w["K"])
    c["Trilu_upper_k1"] = ([node("Trilu", ["A", "k"], ["Y"])], {"A": r(2, 4, 5), "k": I64("k", 1)},
                           lambda w: trilu_ref(w["A"], 1, 1))
    c["Trilu_lower_kneg"] = ([node("Trilu", ["A", "k"], ["Y"], upper=0)], {"A": r(4, 4), "k": I64("k", -1)},
                             lambda w: trilu_ref(w["A"], 0, -1))
    c["Shape_chain_Reshape"] = (view_chain("A"), {"A": r(2, 3, 8), **view_consts()},
                                lambda w: w["A"].reshape(2, 3, 2, 4))
    return c


def rng_bool(shape):
    return np.random.default_rng(7).random(shape) < 0.5


def view_consts():
    return {"i0": I64("i0", 0), "i1": I64("i1", 1), "i2": I64("i2", 2), "nh": I64("nh", [2]),
            "two": I64("two", 2)}


def view_chain(x):
    """x.view(B, T, nh, C // nh) as torch.onnx exports it with dynamic axes."""
    n = [node("Shape", [x], ["shp"])]
    for k in range(3):
        n.append(node("Gather", ["shp", "i%d" % k], ["d%d" % k], axis=0))
    n += [node("Div", ["d2", "two"], ["hs"]),
          node("Unsqueeze", ["d0", "ax0"], ["u0"]), node("Unsqueeze", ["d1", "ax0"], ["u1"]),
          node("Unsqueeze", ["hs", "ax0"], ["u3"]),
          node("Concat", ["u0", "u1", "nh", "u3"], ["newshape"], axis=0),
          node("Reshape", [x, "newshape"], ["Y"])]
    n.insert(0, node("Constant", [], ["ax0"], value=helper.make_tensor("ax0", TensorProto.INT64, [1], [0])))
    return n


def dumped_ops(fsdpc, args):
    p = run([fsdpc] + args + ["--dump-after", "fold"])
    text = p.stdout.split("nodes:", 1)[1]
    return [m.group(1) for m in re.finditer(r"^\s+(?:%\S+(?:, %\S+)* = )?(\w+)", text, re.M)]


def check_folds(fsdpc, work):
    # 1. the gradcheck case: Shape of a parameter
    path = os.path.join(work, "Shape_chain_Reshape.onnx")
    ops = dumped_ops(fsdpc, [path, "--loss", "mse:Y,T"])
    left = [o for o in ops if o in ("Shape", "Gather", "Unsqueeze", "Concat", "Div")]
    check(not left, "shape arithmetic left after fold: %s (nodes: %s)" % (left, ops))
    # 2. a graph input with symbolic dims bound by --dim
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "T", 8])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    g = helper.make_graph(view_chain("x"), "view", [x], [y],
                          [v for v in view_consts().values()])
    path = os.path.join(work, "view_chain_input.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    exe = os.path.join(work, "view_chain_input")
    ops = dumped_ops(fsdpc, [path, "-o", exe, "--target", "cpu", "--eval", "--dim", "B=3", "--dim", "T=5", "--verify"])
    check(ops == ["Reshape"], "after fold with --dim B=3 --dim T=5: nodes %s, expected only Reshape" % ops)
    xv = np.random.default_rng(3).standard_normal((3, 5, 8)).astype(np.float32)
    np.save(exe + ".x.npy", xv)
    out = os.path.join(work, "view_chain_out")
    run([exe, "--input", "x=" + exe + ".x.npy", "--out-dir", out, "--quiet"])
    got = np.load(os.path.join(out, "Y.npy"))
    check(got.shape == (3, 5, 2, 4) and np.array_equal(got, xv.reshape(3, 5, 2, 4)),
          "view chain output %s differs from x.reshape(3, 5, 2, 4)" % (got.shape,))
    print("ok shape arithmetic folds: only Reshape left; --eval output matches NumPy")


def vi(name, arr):
    dt = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
          np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
          np.dtype(np.bool_): TensorProto.BOOL}[arr.dtype]
    return helper.make_tensor_value_info(name, dt, list(arr.shape))


# name: (nodes, graph inputs {name: array}, constants {name: array}, expected {output: array}[, tolerance])
def forward_cases():
    g = np.random.default_rng(5)
    f = g.standard_normal((2, 3, 4)).astype(np.float32)
    b1, b2 = g.random((3, 4)) < 0.5, g.random((4,)) < 0.5
    i32 = g.integers(-5, 5, (3, 4)).astype(np.int32)
    big = (1100, 1000)  # above fold's limit of 2^20 elements: computed at run time
    xi = np.arange(6, dtype=np.int64).reshape(2, 3)
    c = {}
    c["Not"] = ([node("Not", ["b"], ["y"])], {"b": b1}, {}, {"y": ~b1})
    c["Equal_bool"] = ([node("Equal", ["a", "b"], ["y"])], {"a": b1, "b": b2}, {}, {"y": b1 == b2})
    c["Greater_int32"] = ([node("Greater", ["a", "k"], ["y"])], {"a": i32}, {"k": np.array(1, np.int32)},
                          {"y": i32 > 1})
    c["LessOrEqual"] = ([node("LessOrEqual", ["a", "b"], ["y"])], {"a": f[0], "b": f[1]}, {}, {"y": f[0] <= f[1]})
    c["Gather_int32_indices"] = ([node("Gather", ["x", "i"], ["y"], axis=1)],
                                 {"x": f, "i": np.array([[2, -1], [0, 0]], np.int32)}, {},
                                 {"y": f[:, [[2, 2], [0, 0]]]})
    ti = np.array([[0, 2], [-1, 0]], np.int32)
    c["GatherElements_int32_indices_int64"] = ([node("GatherElements", ["x", "i"], ["y"], axis=1)],
                                               {"x": xi, "i": ti}, {}, {"y": np.take_along_axis(xi, ti % 3, 1)})
    fx = np.array([[1.5, np.nan, np.inf], [-np.inf, 0.0, -2.0]])
    c["IsNaN_IsInf_f64"] = ([node("IsNaN", ["x"], ["n"]), node("IsInf", ["x"], ["i"]),
                             node("IsInf", ["x"], ["p"], detect_negative=0), node("IsInf", ["x"], ["q"], detect_positive=0),
                             node("IsInf", ["x"], ["z"], detect_positive=0, detect_negative=0)], {"x": fx}, {},
                            {"n": np.isnan(fx), "i": np.isinf(fx), "p": np.isposinf(fx), "q": np.isneginf(fx),
                             "z": np.zeros(fx.shape, np.bool_)})
    c["And_Or_Xor_broadcast"] = ([node("And", ["a", "b"], ["y"]), node("Or", ["a", "b"], ["o"]),
                                  node("Xor", ["b", "a"], ["x"])], {"a": b1, "b": b2}, {},
                                 {"y": b1 & b2, "o": b1 | b2, "x": b2 ^ b1})
    ta = np.array([[1.0, 3.0, 3.0, -1.0], [np.nan, 2.0, np.nan, 5.0], [0.0, 0.0, 0.0, 0.0]])
    c["ArgMax_ArgMin_ties_nan_f64"] = ([node("ArgMax", ["x"], ["a"], axis=1),
                                        node("ArgMax", ["x"], ["b"], axis=-1, select_last_index=1, keepdims=0),
                                        node("ArgMin", ["x"], ["c"], axis=1, keepdims=0),
                                        node("ArgMin", ["x"], ["d"], select_last_index=1)], {"x": ta}, {},
                                       {"a": arg_ref(np.argmax, ta, 1), "b": arg_ref(np.argmax, ta, 1, 1, 0),
                                        "c": arg_ref(np.argmin, ta, 1, 0, 0), "d": arg_ref(np.argmin, ta, 0, 1)})
    # TopK: ties to the lower index, a NaN ranks as +inf (first of the largest, last of the smallest); int64
    tx = np.array([[1.0, 3.0, 3.0, np.nan, -1.0], [2.0, 2.0, 2.0, 0.0, 5.0]])
    c["TopK_ties_nan_f64"] = ([node("TopK", ["x", "k"], ["v", "i"], axis=1), node("TopK", ["x", "k2"], ["w", "j"], largest=0)],
                              {"x": tx}, {"k": np.array([3], np.int64), "k2": np.array([2], np.int64)},
                              {"i": np.array([[3, 1, 2], [4, 0, 1]]), "j": np.array([[4, 0], [3, 0]]),
                               "w": np.array([[-1.0, 1.0], [0.0, 2.0]])})
    tk = np.array([[4, -2, 7], [4, 9, -1], [0, 9, 3]], np.int64)
    c["TopK_int64_axis0"] = ([node("TopK", ["x", "k"], ["v", "i"], axis=0)], {"x": tk}, {"k": np.array([2], np.int64)},
                             {"v": np.array([[4, 9, 7], [4, 9, 3]], np.int64), "i": np.array([[0, 1, 0], [1, 2, 2]])})
    c["ArgMax_ArgMin_f32"] = ([node("ArgMax", ["x"], ["a"], axis=2, keepdims=0), node("ArgMin", ["x"], ["b"], axis=0)],
                              {"x": f}, {}, {"a": arg_ref(np.argmax, f, 2, 0, 0), "b": arg_ref(np.argmin, f, 0)})
    aq, ak, av, pk, pv = (g.standard_normal(sh) for sh in ((1, 2, 3, 4), (1, 2, 2, 4), (1, 2, 2, 3), (1, 2, 1, 4),
                                                            (1, 2, 1, 3)))
    ks, vs = np.concatenate([pk, ak], 2), np.concatenate([pv, av], 2)
    qk = (aq / 2) @ ks.swapaxes(-1, -2) + np.where(np.arange(3)[:, None] + 1 >= np.arange(3)[None, :], 0, -np.inf)
    c["Attention_present_qk_outputs"] = ([node("Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "kp", "vp", "qk"],
                                               is_causal=1, qk_matmul_output_mode=2)],
                                         {"q": aq}, {"k": ak, "v": av, "pk": pk, "pv": pv},
                                         {"y": attention_ref(aq, ak, av, causal=1, past=(pk, pv)), "kp": ks, "vp": vs,
                                          "qk": qk}, 1e-12)
    c["ConstantOfShape_small"] = ([node("ConstantOfShape", ["s"], ["y"],
                                        value=helper.make_tensor("v", TensorProto.INT64, [1], [7]))],
                                  {}, {"s": np.array([2, 3], np.int64)}, {"y": np.full((2, 3), 7, np.int64)})
    c["ConstantOfShape_large_int"] = ([node("ConstantOfShape", ["s"], ["y"],
                                            value=helper.make_tensor("v", TensorProto.INT32, [1], [-3]))],
                                      {}, {"s": np.array(big, np.int64)}, {"y": np.full(big, -3, np.int32)})
    c["ConstantOfShape_large_float"] = ([node("ConstantOfShape", ["s"], ["y"])], {},
                                        {"s": np.array(big, np.int64)}, {"y": np.zeros(big, np.float32)})
    c["Range_int"] = ([node("Range", ["a", "l", "d"], ["y"])], {},
                      {"a": np.array(10, np.int64), "l": np.array(-3, np.int64), "d": np.array(-4, np.int64)},
                      {"y": np.arange(10, -3, -4, dtype=np.int64)})
    c["Range_float_large"] = ([node("Range", ["a", "l", "d"], ["y"])], {},
                              {"a": np.array(0.5), "l": np.array(1.2e6), "d": np.array(1.0)},
                              {"y": np.arange(0.5, 1.2e6, 1.0)})
    c["Trilu_input"] = ([node("Trilu", ["x"], ["y"], upper=0)], {"x": f}, {}, {"y": np.tril(f)})
    c["Pad_reflect_int64_wraps"] = ([node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": xi},
                                    {"p": np.array([1, 5, 0, 4], np.int64)},
                                    {"y": np.pad(xi, ((1, 0), (5, 4)), mode="reflect")})
    c["Pad_edge_bool"] = ([node("Pad", ["b", "p"], ["y"], mode="edge")], {"b": b1},
                          {"p": np.array([0, 2, 1, 0], np.int64)},
                          {"y": np.pad(b1, ((0, 1), (2, 0)), mode="edge")})
    c["Where_int64"] = ([node("Where", ["b", "x", "z"], ["y"])], {"b": b2, "x": xi[:, :1].repeat(4, 1)},
                        {"z": np.array([9], np.int64)}, {"y": np.where(b2, xi[:, :1], 9)})
    c["Cast_bool_float_int"] = ([node("Cast", ["b"], ["t"], to=TensorProto.FLOAT),
                                 node("Cast", ["x"], ["y2"], to=TensorProto.INT32)],
                                {"b": b1, "x": f * 3}, {}, {"t": b1.astype(np.float32), "y2": (f * 3).astype(np.int32)})
    c["Tile_Expand_int"] = ([node("Tile", ["x", "r"], ["t"]), node("Expand", ["t", "s"], ["y"])], {"x": xi},
                            {"r": np.array([1, 2], np.int64), "s": np.array([3, 1, 1], np.int64)},
                            {"y": np.broadcast_to(np.tile(xi, (1, 2)), (3, 2, 6))})
    # GatherND / ScatterND / ScatterElements with indices a run brings (NDIndex and the checks at run time)
    ni = np.array([[1, 2], [0, -1], [1, 0]], np.int64)
    c["GatherND_runtime_indices"] = ([node("GatherND", ["x", "i"], ["y"])], {"x": f, "i": ni}, {},
                                     {"y": f[ni[:, 0], ni[:, 1]]})
    d, u = g.standard_normal((5, 3)).astype(np.float32), g.standard_normal((4, 3)).astype(np.float32)
    si = np.array([[4], [0], [4], [-2]], np.int64)
    c["ScatterND_add_runtime_indices"] = ([node("ScatterND", ["d", "i", "u"], ["y"], reduction="add")],
                                          {"d": d, "i": si, "u": u}, {}, {"y": scatter_nd_ref(d, si % 5, u, 1)}, 1e-6)
    c["ScatterElements_max_runtime_indices"] = ([node("ScatterElements", ["d", "i", "u"], ["y"], axis=0,
                                                      reduction="max")],
                                                 {"d": d, "i": np.array([[4, 0, -1], [4, 4, 2]], np.int64),
                                                  "u": u[:2]}, {},
                                                 {"y": scatter_elements_ref(d, np.array([[4, 0, 4], [4, 4, 2]]),
                                                                            u[:2], 0, "max")})
    c["ScatterElements_mul_runtime_indices"] = ([node("ScatterElements", ["d", "i", "u"], ["y"], axis=0,
                                                      reduction="mul")],
                                                 {"d": d, "i": np.array([[4, 0, -1], [4, 4, 2]], np.int64),
                                                  "u": u[:2]}, {},
                                                 {"y": scatter_elements_ref(d, np.array([[4, 0, 4], [4, 4, 2]]),
                                                                            u[:2], 0, "mul")}, 1e-6)
    c["ScatterND_min_runtime_indices"] = ([node("ScatterND", ["d", "i", "u"], ["y"], reduction="min")],
                                          {"d": d, "i": si, "u": u}, {}, {"y": scatter_nd_ref(d, si % 5, u, "min")})
    ei = np.array([[2, 0, 1], [0, 1, 2]], np.int32)
    c["ScatterElements_int32_runtime_indices"] = ([node("ScatterElements", ["d", "i", "u"], ["y"], axis=1)],
                                                  {"d": d[:3], "i": ei, "u": u[:2]}, {},
                                                  {"y": scatter_elements_ref(d[:3], ei, u[:2], 1, 0)})
    # int64 index arithmetic at run time (what exporters write for index normalisation and broadcast shapes)
    ia, ib = g.integers(-9, 10, (2, 3)).astype(np.int64), np.array([4, -3, 7], np.int64)
    trunc = np.sign(ia) * np.sign(ib) * (np.abs(ia) // np.abs(ib))
    c["Int64_arithmetic_runtime"] = ([node("Add", ["a", "b"], ["add"]), node("Sub", ["a", "b"], ["sub"]),
                                      node("Mul", ["a", "b"], ["mul"]), node("Div", ["a", "b"], ["div"]),
                                      node("Mod", ["a", "b"], ["mod"]), node("Mod", ["a", "b"], ["fmod"], fmod=1),
                                      node("Max", ["a", "b", "k"], ["max"]), node("Min", ["a", "b"], ["min"])],
                                     {"a": ia, "b": ib}, {"k": np.array(-2, np.int64)},
                                     {"add": ia + ib, "sub": ia - ib, "mul": ia * ib, "div": trunc,
                                      "mod": np.mod(ia, ib), "fmod": np.fmod(ia, ib),
                                      "max": np.maximum(np.maximum(ia, ib), -2), "min": np.minimum(ia, ib)})
    c["Size_Shape_start_end"] = ([node("Size", ["x"], ["n"]), node("Shape", ["x"], ["s"], start=-2, end=10)],
                                 {"x": f}, {}, {"n": np.array(24, np.int64), "s": np.array([3, 4], np.int64)})
    return c


def check_forward(fsdpc, work, name, spec):
    nodes, inputs, consts, want = spec[:4]
    tol = spec[4] if len(spec) > 4 else 0  # float outputs within tol, else exact
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    outs = [helper.make_tensor_value_info(k, TensorProto.UNDEFINED, None) for k in want]
    g = helper.make_graph(nodes, name, [vi(k, v) for k, v in inputs.items()], outs, inits)
    path = os.path.join(work, name + ".onnx")
    opset = max([17] + [NEWER_OPS.get(n.op_type, 17) for n in nodes])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    exe = os.path.join(work, name)
    run([fsdpc, path, "-o", exe, "--target", "cpu", "--eval", "--verify"])
    args = [exe, "--out-dir", exe + ".out", "--quiet"]
    for k, v in inputs.items():
        np.save(exe + "." + k + ".npy", v)
        args += ["--input", "%s=%s.%s.npy" % (k, exe, k)]
    run(args)
    for k, v in want.items():
        got = np.load(os.path.join(exe + ".out", k + ".npy"))
        same = np.allclose(got, v, rtol=tol, atol=tol) if tol else np.array_equal(got, v)
        check(got.dtype == v.dtype and got.shape == v.shape and same,
              "%s: output %s %s %s, expected %s %s" % (name, k, got.dtype, got.shape, v.dtype, v.shape))
    print("ok forward %-26s" % name)


def check_errors(fsdpc, work):
    """A shape-deciding input that is not a constant: one line naming node, op and input."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    st = helper.make_tensor_value_info("st", TensorProto.INT64, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    g = helper.make_graph([node("Slice", ["x", "st", "en"], ["y"], name="sl")], "g", [x, st], [y],
                          [I64("en", [3])])
    path = os.path.join(work, "nonconst_slice.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    p = run([fsdpc, path, "-o", os.path.join(work, "nc"), "--target", "cpu", "--loss", "mse:y,t", "--dim", "batch=2"], check=False)
    msg = p.stderr.strip()
    check(p.returncode == 1 and len(msg.splitlines()) == 1 and
          all(w in msg for w in ("nonconst_slice.onnx", "'sl'", "Slice", "'st'", "must be a constant")),
          "non-constant Slice starts: exit %d, %r" % (p.returncode, msg))
    print("ok non-constant starts: %s" % msg)
    # an index a run brings that is outside the data: the step fails naming node, op, index and input
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    i = helper.make_tensor_value_info("i", TensorProto.INT64, [2, 2])
    g = helper.make_graph([node("GatherElements", ["x", "i"], ["y"], name="ge", axis=1)], "g", [x, i], [y])
    path = os.path.join(work, "ge_bad.onnx")
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
    exe = os.path.join(work, "ge_bad")
    run([fsdpc, path, "-o", exe, "--target", "cpu", "--eval"])
    np.save(exe + ".x.npy", np.zeros((2, 3), np.float32))
    np.save(exe + ".i.npy", np.array([[0, 2], [3, 1]], np.int64))
    p = run([exe, "--out-dir", exe + ".out", "--quiet", "--input", "x=%s.x.npy" % exe, "--input", "i=%s.i.npy" % exe],
            check=False)
    msg = p.stderr.strip()
    check(p.returncode != 0 and len(msg.splitlines()) == 1 and
          all(w in msg for w in ("ge (GatherElements)", "index 3 at position 2", "outside [-3, 3)")),
          "GatherElements index out of range at run time: exit %d, %r" % (p.returncode, msg))
    print("ok run-time index check: %s" % msg)
    # ScatterElements' and GatherND's indices a run brings, an integer division by zero: the same, naming the node
    for tag, nodes, ins, needles in (
            ("div", [node("Div", ["a", "b"], ["y"], name="dv")],
             {"a": np.ones((2, 3), np.int64), "b": np.array([1, 0, 2], np.int64)},
             ("dv (Div)", "integer division by zero at position 1")),
            ("scatter", [node("ScatterElements", ["x", "i", "u"], ["y"], name="se", axis=1)],
             {"x": np.zeros((2, 3), np.float32), "i": np.array([[0, 1], [2, -4]], np.int64),
              "u": np.ones((2, 2), np.float32)},
             ("se/scatter (ScatterElements)", "index -4 at position 3", "outside [-3, 3)")),
            ("gathernd", [node("GatherND", ["x", "i"], ["y"], name="gn")],
             {"x": np.zeros((2, 3), np.float32), "i": np.array([[1, 2], [1, 3]], np.int64)},
             ("gn/positions", "index 3 at position 3", "component 1 of tuples indexing dims {2, 3}"))):
        g = helper.make_graph(nodes, "g", [vi(k, v) for k, v in ins.items()],
                              [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
        path = os.path.join(work, "%s_bad.onnx" % tag)
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)
        exe = os.path.join(work, "%s_bad" % tag)
        run([fsdpc, path, "-o", exe, "--target", "cpu", "--eval"])
        args = [exe, "--out-dir", exe + ".out", "--quiet"]
        for k, v in ins.items():
            np.save("%s.%s.npy" % (exe, k), v)
            args += ["--input", "%s=%s.%s.npy" % (k, exe, k)]
        p = run(args, check=False)
        msg = p.stderr.strip()
        check(p.returncode != 0 and len(msg.splitlines()) == 1 and all(w in msg for w in needles),
              "%s index out of range at run time: exit %d, %r" % (tag, p.returncode, msg))
        print("ok run-time index check: %s" % msg)


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    all_cases, fwd = cases(), forward_cases()
    names = sys.argv[3:] or list(all_cases) + list(fwd)
    for n in names:
        check(n in all_cases or n in fwd, "no case " + n)
        if n in fwd:
            check_forward(fsdpc, work, n, fwd[n])
        else:
            check_case(fsdpc, work, n, all_cases[n])
    if "Shape_chain_Reshape" in names:
        check_folds(fsdpc, work)
    if not sys.argv[3:]:
        check_errors(fsdpc, work)
    print("OK gradcheck_tensor: %d cases" % len(names))


if __name__ == "__main__":
    main()
