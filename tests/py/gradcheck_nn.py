"""The nn family's gradient rules against central finite differences, in float64.

usage: gradcheck_nn.py FSDPC WORKDIR [CASE...]

Same method as gradcheck.py (whose helpers it uses): each case is a small
float64 graph whose op inputs are trainable initializers; the forward loss
must match a NumPy reference and the gradient (one SGD step, lr 1) must match
central finite differences along random directions.  Besides:
  - BatchNorm_running_stats: the running mean / var exported after one
    training step equal NumPy's update (ONNX momentum, unbiased variance);
  - BatchNorm_train_eps_1e-5: epsilon 1e-5 (a float32 attribute) is used as
    the double 1e-5, as PyTorch's float64 BatchNorm does;
  - Dropout cases recompute the mask in NumPy (Philox-4x32-10 keyed by the
    compile-time seed, counter = element / 4, step, hash of the node name),
    so the forward is checked exactly and finite differences are valid: the
    mask depends only on (seed, node, step, element);
  - SCE_* / NLL_* cases end the model in SoftmaxCrossEntropyLoss or
    LogSoftmax + NegativeLogLikelihoodLoss and compile without --loss: the
    model's own loss is trained, its labels fed as data.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, onnx_weights, read_metrics, run
from gradcheck import check_case, compile_run, r

rng = np.random.default_rng(7)
node = helper.make_node


def const(name, a, dtype=np.float64):
    return numpy_helper.from_array(np.asarray(a, dtype), name)


def pos(*shape):
    return 0.5 + np.abs(r(*shape))


# ---- NumPy references -------------------------------------------------------

def conv_ref(x, w, b, s, p, d, group):
    n, c, h, wd = x.shape
    m, cg, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (p[0], p[2]), (p[1], p[3])))
    oh = (h + p[0] + p[2] - d[0] * (kh - 1) - 1) // s[0] + 1
    ow = (wd + p[1] + p[3] - d[1] * (kw - 1) - 1) // s[1] + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // group
    for gi in range(group):
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, gi * cg:(gi + 1) * cg, i * d[0]:i * d[0] + s[0] * (oh - 1) + 1:s[0],
                           j * d[1]:j * d[1] + s[1] * (ow - 1) + 1:s[1]]
                y[:, gi * mg:(gi + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, w[gi * mg:(gi + 1) * mg, :, i, j])
    return y if b is None else y + b[None, :, None, None]


def conv_transpose_ref(x, w, b, s, p, d, group, op):
    """ConvTranspose directly: each input pixel scatters x * w into the output (pads p t l b r cut the
    output's border off, output padding op adds to its end)."""
    n, c, h, wd = x.shape
    _, mg, kh, kw = w.shape
    oh = s[0] * (h - 1) + op[0] + d[0] * (kh - 1) + 1 - p[0] - p[2]
    ow = s[1] * (wd - 1) + op[1] + d[1] * (kw - 1) + 1 - p[1] - p[3]
    y = np.zeros((n, mg * group, oh, ow))
    cg = c // group
    for ci in range(c):
        gi = ci // cg
        for i in range(h):
            for j in range(wd):
                for a in range(kh):
                    for e in range(kw):
                        yi, yj = i * s[0] - p[0] + a * d[0], j * s[1] - p[1] + e * d[1]
                        if 0 <= yi < oh and 0 <= yj < ow:
                            y[:, gi * mg:(gi + 1) * mg, yi, yj] += x[:, ci, i, j][:, None] * w[ci, :, a, e][None, :]
    return y if b is None else y + b[None, :, None, None]


def out_dim(n, k, s, pb, pe, d, ceil):
    num = n + pb + pe - d * (k - 1) - 1
    o = (-(-num // s) if ceil else num // s) + 1
    return o - 1 if ceil and (o - 1) * s >= n + pb else o


def pool_ref(x, k, s, p, d, ceil, kind, cip=0, lp=2):
    """kind max, avg (cip: count_include_pad) or lp (the lp-norm of each window, pads 0)"""
    n, c, h, w = x.shape
    oh, ow = out_dim(h, k[0], s[0], p[0], p[2], d[0], ceil), out_dim(w, k[1], s[1], p[1], p[3], d[1], ceil)
    y = np.zeros((n, c, oh, ow))
    for oy in range(oh):
        for ox in range(ow):
            ys = [oy * s[0] - p[0] + i * d[0] for i in range(k[0])]
            xs = [ox * s[1] - p[1] + j * d[1] for j in range(k[1])]
            iy = [t for t in ys if 0 <= t < h]
            ix = [t for t in xs if 0 <= t < w]
            win = x[:, :, iy][:, :, :, ix]
            if kind == "max":
                y[:, :, oy, ox] = win.max((2, 3))
            elif kind == "lp":
                y[:, :, oy, ox] = (np.abs(win) ** lp).sum((2, 3)) ** (1.0 / lp)
            else:
                if cip:
                    div = sum(-p[0] <= t < h + p[2] for t in ys) * sum(-p[1] <= t < w + p[3] for t in xs)
                else:
                    div = len(iy) * len(ix)
                y[:, :, oy, ox] = win.sum((2, 3)) / div
    return y


ACTS = {"Sigmoid": lambda v: 1 / (1 + np.exp(-v)), "Tanh": np.tanh, "Relu": lambda v: np.maximum(v, 0)}


def recurrent_ref(kind, X, W, R, B=None, h0=None, c0=None, P=None, direction="forward", lbr=0, layout=0, acts=None,
                  clip=None, out="Y"):
    """ONNX's RNN / GRU / LSTM written out step by step (gates i o f c, z r h); Y [T, dirs, B, H] or Y_h"""
    if layout:
        X = X.transpose(1, 0, 2)
        h0 = None if h0 is None else h0.transpose(1, 0, 2)
        c0 = None if c0 is None else c0.transpose(1, 0, 2)
    T, nb, _ = X.shape
    D, H = W.shape[0], R.shape[2]
    G = {"RNN": 1, "GRU": 3, "LSTM": 4}[kind]
    nact = {"RNN": 1, "GRU": 2, "LSTM": 3}[kind]
    names = acts or {"RNN": ["Tanh"], "GRU": ["Sigmoid", "Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"]}[kind] * D
    cl = (lambda v: np.clip(v, -clip, clip)) if clip else (lambda v: v)
    ys, hs, cs = [], [], []
    for d in range(D):
        f, g, h = ([ACTS[a] for a in names[d * nact:(d + 1) * nact]] + [None, None])[:3]
        wb = B[d][:G * H] if B is not None else np.zeros(G * H)
        rb = B[d][G * H:] if B is not None else np.zeros(G * H)
        ht = h0[d] if h0 is not None else np.zeros((nb, H))
        ct = c0[d] if c0 is not None else np.zeros((nb, H))
        y = [None] * T
        for t in (range(T - 1, -1, -1) if direction == "reverse" or d == 1 else range(T)):
            xw = X[t] @ W[d].T + wb
            if kind == "RNN":
                ht = f(cl(xw + ht @ R[d].T + rb))
            elif kind == "LSTM":
                pre = xw + ht @ R[d].T + rb
                i, o, fg, c = (pre[:, k * H:(k + 1) * H] for k in range(4))
                if P is not None:
                    i, fg = i + P[d][:H] * ct, fg + P[d][2 * H:] * ct
                ct = f(cl(fg)) * ct + f(cl(i)) * g(cl(c))
                if P is not None:
                    o = o + P[d][H:2 * H] * ct
                ht = f(cl(o)) * h(ct)
            else:
                hr = ht @ R[d].T + rb
                z = f(cl(xw[:, :H] + hr[:, :H]))
                rr = f(cl(xw[:, H:2 * H] + hr[:, H:2 * H]))
                hh = (rr * hr[:, 2 * H:] if lbr else (rr * ht) @ R[d][2 * H:].T + rb[2 * H:])
                ht = (1 - z) * g(cl(xw[:, 2 * H:] + hh)) + z * ht
            y[t] = ht
        ys.append(np.stack(y))
        hs.append(ht)
        cs.append(ct)
    Y, Yh = np.stack(ys, 1), np.stack(hs)
    if layout:
        Y, Yh = Y.transpose(2, 0, 1, 3), Yh.transpose(1, 0, 2)
    return Y if out == "Y" else Yh


def bn_ref(x, scale, bias, eps):
    ax = (0,) + tuple(range(2, x.ndim))
    sh = (1, -1) + (1,) * (x.ndim - 2)
    mean, var = x.mean(ax), x.var(ax)
    return (x - mean.reshape(sh)) / np.sqrt(var.reshape(sh) + eps) * scale.reshape(sh) + bias.reshape(sh)


def ln_ref(x, scale, bias, axis, eps):
    ax = tuple(range(axis % x.ndim, x.ndim))
    mean, var = x.mean(ax, keepdims=True), x.var(ax, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * scale + bias


def softmax(x, axis):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


M32 = 0xFFFFFFFF
SEED = 0x6673647063  # NN_DROPOUT_SEED in ir/rules/nn.h


def philox(ctr, key):
    c0, c1, c2, c3 = ctr
    k0, k1 = key
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return c0, c1, c2, c3


def fnv32(s):
    h = 2166136261
    for ch in s.encode():
        h = ((h ^ ch) * 16777619) & M32
    return h


def dropout_mask(n, ratio, name, step=1):
    stream, words = fnv32(name), []
    for blk in range((n + 3) // 4):
        words += philox((blk & M32, blk >> 32, step, stream), (SEED & M32, SEED >> 32))
    return np.array([wd >= ratio * 4294967296.0 for wd in words[:n]])


def sce_ref(z, labels, weights=None, ii=None, reduction="mean"):
    logp = np.log(softmax(z, 1))
    c = z.shape[1]
    lab = np.where(labels == ii, 0, labels) if ii is not None else labels
    picked = -np.take_along_axis(logp, lab[:, None], 1)[:, 0]
    w = (weights[lab] if weights is not None else np.ones_like(picked)) * (labels != ii if ii is not None else 1)
    assert c > labels.max()
    if reduction == "none":
        return picked * w
    return (picked * w).sum() / (w.sum() if reduction == "mean" else 1)


# ---- the cases ----------------------------------------------------------------

def conv_case(c, name, op, attrs, xs, ws, nb, ref):
    """c[name] := a case of one Conv or ConvTranspose node (op) with attributes attrs on a random X of shape xs, W of
    shape ws and, when nb, B of length nb; ref(weights): its NumPy reference (gradcheck_3d.py's cases too)"""
    wts = {"X": r(*xs), "W": r(*ws)}
    if nb:
        wts["B"] = r(nb)
    c[name] = ([node(op, list(wts), ["Y"], **attrs)], wts, ref)


def conv_cases(c):
    def add(name, xs, ws, s, p, d, group, bias):
        attrs = dict(strides=s, pads=p, dilations=d, group=group, kernel_shape=list(ws[2:]))
        conv_case(c, name, "Conv", attrs, xs, ws, bias and ws[0],
                  lambda w: conv_ref(w["X"], w["W"], w.get("B"), s, p, d, group))
    add("Conv_stride2_pads_bias", (2, 3, 7, 6), (4, 3, 3, 3), [2, 2], [1, 0, 2, 1], [1, 1], 1, True)
    add("Conv_dilation", (1, 2, 7, 7), (3, 2, 3, 2), [1, 2], [1, 1, 1, 1], [2, 1], 1, False)
    add("Conv_groups2", (2, 4, 5, 5), (6, 2, 3, 3), [1, 1], [1, 1, 1, 1], [1, 1], 2, True)
    add("Conv_depthwise", (2, 4, 6, 5), (4, 1, 3, 3), [2, 1], [1, 1, 0, 1], [1, 1], 4, True)
    add("Conv_1x1", (2, 3, 4, 4), (5, 3, 1, 1), [1, 1], [0, 0, 0, 0], [1, 1], 1, True)

    def add1d(name, xs, ws, s, p, d, group, bias):  # 1-D: the 2-D reference over a height of 1
        attrs = dict(strides=[s], pads=p, dilations=[d], group=group, kernel_shape=[ws[2]])
        conv_case(c, name, "Conv", attrs, xs, ws, bias and ws[0],
                  lambda w: conv_ref(w["X"][:, :, None], w["W"][:, :, None], w.get("B"), [1, s], [0, p[0], 0, p[1]],
                                     [1, d], group)[:, :, 0])
    add1d("Conv1d_stride2_pads_bias", (2, 3, 9), (4, 3, 3), 2, [1, 2], 1, 1, True)
    add1d("Conv1d_dilation_groups", (2, 4, 10), (6, 2, 3), 1, [2, 0], 2, 2, False)
    # auto_pad SAME_LOWER, the pads it stands for given to the reference: H 7 at stride 2 keeps 4 rows, the
    # 3-row window needs 2 more (1 before, 1 after); W 6 keeps 3, the dilated 5-wide window needs 3 (the odd one
    # before: 2, 1)
    c["Conv_auto_pad_same_lower"] = (
        [node("Conv", ["X", "W", "B"], ["Y"], strides=[2, 2], dilations=[1, 2], auto_pad="SAME_LOWER")],
        {"X": r(1, 2, 7, 6), "W": r(3, 2, 3, 3), "B": r(3)},
        lambda w: conv_ref(w["X"], w["W"], w["B"], [2, 2], [1, 2, 1, 1], [1, 2], 1))



def conv_transpose_cases(c):
    def add(name, xs, ws, s, p, d, group, op, bias, shape=None):
        """2-D; shape: output_shape instead of pads (the pads it implies given as p and op to the reference)"""
        attrs = dict(strides=s, dilations=d, group=group, kernel_shape=list(ws[2:]))
        attrs.update(output_shape=shape) if shape else attrs.update(pads=p, output_padding=op)
        conv_case(c, name, "ConvTranspose", attrs, xs, ws, bias and ws[1] * group,
                  lambda w: conv_transpose_ref(w["X"], w["W"], w.get("B"), s, p, d, group, op))
    add("ConvT_stride2_pads_outpad_bias", (2, 3, 4, 3), (3, 4, 3, 3), [2, 2], [1, 0, 2, 1], [1, 1], 1, [1, 1], True)
    add("ConvT_dilation", (1, 2, 4, 5), (2, 3, 3, 2), [1, 2], [1, 1, 1, 1], [2, 1], 1, [0, 1], False)
    add("ConvT_groups2_bias", (2, 4, 4, 4), (4, 3, 3, 3), [2, 1], [1, 1, 1, 1], [1, 1], 2, [0, 0], True)
    add("ConvT_depthwise", (2, 3, 3, 4), (3, 1, 2, 3), [2, 2], [0, 1, 0, 0], [1, 1], 3, [1, 0], False)
    # ONNX's own example: output_shape 10 x 8 is the natural 9 x 7 plus one: pads 0, an extra row and column
    add("ConvT_output_shape", (1, 2, 3, 3), (2, 2, 3, 3), [3, 2], [0, 0, 0, 0], [1, 1], 1, [1, 1], False, [10, 8])

    def add1d(name, xs, ws, s, p, d, group, op, bias):  # 1-D: the 2-D reference over a height of 1
        attrs = dict(strides=[s], pads=p, dilations=[d], group=group, kernel_shape=[ws[2]], output_padding=[op])
        conv_case(c, name, "ConvTranspose", attrs, xs, ws, bias and ws[1] * group,
                  lambda w: conv_transpose_ref(w["X"][:, :, None], w["W"][:, :, None], w.get("B"), [1, s],
                                               [0, p[0], 0, p[1]], [1, d], group, [0, op])[:, :, 0])
    add1d("ConvT1d_stride2_pads_bias", (2, 3, 5), (3, 4, 3), 2, [1, 2], 1, 1, 1, True)
    add1d("ConvT1d_dilation_groups", (2, 4, 6), (4, 3, 3), 1, [2, 0], 2, 2, 0, False)
    # auto_pad SAME_UPPER: the output is in x stride (6 x 8); the natural 7 x 9 less 1 each, taken after
    c["ConvT_auto_pad_same_upper"] = (
        [node("ConvTranspose", ["X", "W"], ["Y"], strides=[2, 2], auto_pad="SAME_UPPER")],
        {"X": r(1, 2, 3, 4), "W": r(2, 3, 3, 3)},
        lambda w: conv_transpose_ref(w["X"], w["W"], None, [2, 2], [0, 0, 1, 1], [1, 1], 1, [0, 0]))

def norm_cases(c):
    eps, mom = 2.0 ** -8, 0.75  # exact in the float32 ONNX attributes
    rm, rv = r(3), pos(3)
    bn_w = {"X": r(4, 3, 3, 2), "S": pos(3), "Bb": r(3), "rm": const("rm", rm), "rv": const("rv", rv)}
    c["BatchNorm_train"] = ([node("BatchNormalization", ["X", "S", "Bb", "rm", "rv"], ["Y"], epsilon=eps,
                                  momentum=mom, training_mode=1)], bn_w,
                            lambda w: bn_ref(w["X"], w["S"], w["Bb"], eps))
    c["BatchNorm_train_2d"] = ([node("BatchNormalization", ["X", "S", "Bb", "rm", "rv"], ["Y"], epsilon=eps,
                                     momentum=mom, training_mode=1)],
                               {**bn_w, "X": r(6, 3)}, lambda w: bn_ref(w["X"], w["S"], w["Bb"], eps))
    # PyTorch's default epsilon 1e-5, which the float32 attribute holds as 9.99999974737875e-06: read back as
    # 1e-5 (the shortest decimal of that float32), as PyTorch's float64 BatchNorm uses it.  A batch of variance
    # ~1e-6 makes the output depend on epsilon: the float32 value would be 1e-8 off in the loss (checked to 1e-12)
    small = 1e-3 * np.random.default_rng(7).standard_normal((4, 3, 3, 2))
    c["BatchNorm_train_eps_1e-5"] = ([node("BatchNormalization", ["X", "S", "Bb", "rm", "rv"], ["Y"], epsilon=1e-5,
                                           momentum=0.9, training_mode=1)], {**bn_w, "X": small},
                                     lambda w: bn_ref(w["X"], w["S"], w["Bb"], 1e-5))
    sh = (1, 3, 1, 1)
    c["BatchNorm_inference"] = ([node("BatchNormalization", ["X", "S", "Bb", "rm", "rv"], ["Y"], epsilon=eps)],
                                bn_w, lambda w: (w["X"] - rm.reshape(sh)) / np.sqrt(rv.reshape(sh) + eps)
                                * w["S"].reshape(sh) + w["Bb"].reshape(sh))
    c["LayerNorm_last"] = ([node("LayerNormalization", ["X", "S", "Bb"], ["Y"], epsilon=eps)],
                           {"X": r(2, 3, 5), "S": r(5), "Bb": r(5)},
                           lambda w: ln_ref(w["X"], w["S"], w["Bb"], -1, eps))
    c["LayerNorm_axis1"] = ([node("LayerNormalization", ["X", "S", "Bb"], ["Y"], axis=1, epsilon=eps)],
                            {"X": r(2, 3, 4), "S": r(3, 4), "Bb": r(3, 4)},
                            lambda w: ln_ref(w["X"], w["S"], w["Bb"], 1, eps))
    c["LayerNorm_nobias"] = ([node("LayerNormalization", ["X", "S"], ["Y"], epsilon=eps)],
                             {"X": r(3, 6), "S": r(6)}, lambda w: ln_ref(w["X"], w["S"], 0, -1, eps))


def recurrent_cases(c):
    s = lambda *sh: 0.5 * r(*sh)
    lw = {"X": r(4, 2, 3), "W": s(2, 12, 3), "R": s(2, 12, 3), "B": s(2, 24), "h0": s(2, 2, 3), "c0": s(2, 2, 3),
          "P": s(2, 9)}
    c["LSTM_bidirectional_peepholes"] = (
        [node("LSTM", ["X", "W", "R", "B", "", "h0", "c0", "P"], ["Y"], hidden_size=3, direction="bidirectional")], lw,
        lambda w: recurrent_ref("LSTM", w["X"], w["W"], w["R"], w["B"], w["h0"], w["c0"], w["P"],
                                direction="bidirectional"))
    c["GRU_reverse_Y_h"] = (  # the first output unnamed: Y_h is the loss's
        [node("GRU", ["X", "W", "R", "B"], ["", "Y"], hidden_size=2, direction="reverse")],
        {"X": r(3, 2, 3), "W": s(1, 6, 3), "R": s(1, 6, 2), "B": s(1, 12)},
        lambda w: recurrent_ref("GRU", w["X"], w["W"], w["R"], w["B"], direction="reverse", out="Y_h"))
    c["GRU_linear_before_reset_batch_major"] = (
        [node("GRU", ["X", "W", "R", "B", "", "h0"], ["Y"], hidden_size=3, linear_before_reset=1, layout=1)],
        {"X": r(2, 3, 2), "W": s(1, 9, 2), "R": s(1, 9, 3), "B": s(1, 18), "h0": s(2, 1, 3)},
        lambda w: recurrent_ref("GRU", w["X"], w["W"], w["R"], w["B"], w["h0"], lbr=1, layout=1))
    c["RNN_relu_clip"] = (
        [node("RNN", ["X", "W", "R", "B"], ["Y"], hidden_size=3, activations=["Relu"], clip=1.5)],
        {"X": r(4, 2, 3), "W": s(1, 3, 3), "R": s(1, 3, 3), "B": s(1, 6)},
        lambda w: recurrent_ref("RNN", w["X"], w["W"], w["R"], w["B"], acts=["Relu"], clip=1.5))


def pool_cases(c):
    def add(name, op, xs, k, s, p, d=(1, 1), ceil=0, cip=0):
        attrs = dict(kernel_shape=k, strides=s, pads=p, ceil_mode=ceil)
        if op == "MaxPool":
            attrs["dilations"] = list(d)
        else:
            attrs["count_include_pad"] = cip
        kind = "max" if op == "MaxPool" else "avg"
        c[name] = ([node(op, ["X"], ["Y"], **attrs)], {"X": r(*xs)},
                   lambda w: pool_ref(w["X"], k, s, p, d, ceil, kind, cip))
    add("MaxPool_pads", "MaxPool", (2, 3, 7, 6), [3, 3], [2, 2], [1, 1, 1, 1])
    add("MaxPool_dilation_ceil", "MaxPool", (1, 2, 8, 7), [2, 3], [2, 2], [0, 1, 0, 1], d=(2, 1), ceil=1)
    add("AveragePool_exclude_pad", "AveragePool", (2, 2, 6, 7), [3, 2], [2, 1], [1, 1, 1, 0], ceil=1)
    add("AveragePool_include_pad", "AveragePool", (2, 2, 6, 7), [3, 3], [2, 2], [1, 1, 1, 1], cip=1)
    c["GlobalAveragePool"] = ([node("GlobalAveragePool", ["X"], ["Y"])], {"X": r(2, 3, 4, 5)},
                              lambda w: w["X"].mean((2, 3), keepdims=True))
    # 1-D: the 2-D reference over a height of 1
    c["MaxPool1d"] = ([node("MaxPool", ["X"], ["Y"], kernel_shape=[3], strides=[2], pads=[1, 1], ceil_mode=1)],
                      {"X": r(2, 3, 8)},
                      lambda w: pool_ref(w["X"][:, :, None], [1, 3], [1, 2], [0, 1, 0, 1], (1, 1), 1, "max", 0)[:, :, 0])
    c["AveragePool1d"] = ([node("AveragePool", ["X"], ["Y"], kernel_shape=[2], strides=[2], pads=[0, 1])],
                          {"X": r(2, 3, 7)},
                          lambda w: pool_ref(w["X"][:, :, None], [1, 2], [1, 2], [0, 0, 0, 1], (1, 1), 0, "avg", 0)[:, :, 0])
    # auto_pad SAME_LOWER, 1-D: 7 at stride 2 keeps 4, the 2-wide window needs 1 more, before (not counted)
    c["AveragePool1d_auto_pad_same_lower"] = (
        [node("AveragePool", ["X"], ["Y"], kernel_shape=[2], strides=[2], auto_pad="SAME_LOWER")], {"X": r(2, 3, 7)},
        lambda w: pool_ref(w["X"][:, :, None], [1, 2], [1, 2], [0, 1, 0, 0], (1, 1), 0, "avg", 0)[:, :, 0])
    # LpPool: the p-norm of each window (its pads zeros); p 3 with pads, dilations and ceil_mode's partial last
    # window; p 2 and 1-D SAME_UPPER (7 at stride 2: 4 outputs, the 3-wide window 2 beyond: 1 before, 1 after); p 1
    c["LpPool_p3_pads_dilation_ceil"] = (
        [node("LpPool", ["X"], ["Y"], p=3, kernel_shape=[2, 3], strides=[2, 2], pads=[1, 0, 0, 1], dilations=[1, 2],
              ceil_mode=1)], {"X": r(2, 3, 6, 7)},
        lambda w: pool_ref(w["X"], [2, 3], [2, 2], [1, 0, 0, 1], (1, 2), 1, "lp", lp=3))
    c["LpPool1d_p2_auto_pad_same_upper"] = (
        [node("LpPool", ["X"], ["Y"], kernel_shape=[3], strides=[2], auto_pad="SAME_UPPER")], {"X": r(2, 3, 7)},
        lambda w: pool_ref(w["X"][:, :, None], [1, 3], [1, 2], [0, 1, 0, 1], (1, 1), 0, "lp", lp=2)[:, :, 0])
    c["LpPool_p1"] = ([node("LpPool", ["X"], ["Y"], p=1, kernel_shape=[2, 2], strides=[1, 2])], {"X": r(2, 2, 4, 5)},
                      lambda w: pool_ref(w["X"], [2, 2], [1, 2], [0, 0, 0, 0], (1, 1), 0, "lp", lp=1))
    c["GlobalAveragePool1d"] = ([node("GlobalAveragePool", ["X"], ["Y"])], {"X": r(2, 3, 5)},
                                lambda w: w["X"].mean(2, keepdims=True))


def reduce_cases(c):
    for op, f in (("ReduceMean", np.mean), ("ReduceMax", np.max), ("ReduceMin", np.min), ("ReduceProd", np.prod)):
        for axes, keep in (([1], 1), ([0, 2], 0), ([-1], 0), (None, 1)):
            attrs = {"keepdims": keep} if axes is None else {"axes": axes, "keepdims": keep}
            tag = "all" if axes is None else "_".join(str(a) for a in axes).replace("-", "m")
            c["%s_%s_k%d" % (op, tag, keep)] = (
                [node(op, ["X"], ["Y"], **attrs)], {"X": r(2, 3, 4)},
                (lambda f, ax, k: lambda w: f(w["X"], axis=None if ax is None else tuple(ax), keepdims=bool(k)))(
                    f, axes, keep))
    for axes, keep in (([1], 0), ([0, -1], 1)):
        tag = "_".join(str(a) for a in axes).replace("-", "m")
        c["ReduceSum_%s_k%d" % (tag, keep)] = (
            [node("ReduceSum", ["X", "axes"], ["Y"], keepdims=keep)],
            {"X": r(2, 3, 4), "axes": const("axes", axes, np.int64)},
            (lambda ax, k: lambda w: w["X"].sum(tuple(ax), keepdims=bool(k)))(axes, keep))
    # ReduceProd's gradient is the product of the others, at zeros too: over axis 1 the groups (0, :, 2) hold
    # one zero and (1, :, 3) two; over axes (0, 2) every group holds one
    xz = r(2, 3, 4)
    xz[0, 1, 2] = xz[1, 0, 3] = xz[1, 2, 3] = 0
    for axes, keep in (([1], 1), ([0, 2], 0)):
        tag = "_".join(str(a) for a in axes)
        c["ReduceProd_zeros_%s_k%d" % (tag, keep)] = (
            [node("ReduceProd", ["X"], ["Y"], axes=axes, keepdims=keep)], {"X": xz},
            (lambda ax, k: lambda w: np.prod(w["X"], axis=tuple(ax), keepdims=bool(k)))(axes, keep))
    c["ReduceSum_noaxes"] = ([node("ReduceSum", ["X"], ["Y"])], {"X": r(2, 3)},
                             lambda w: w["X"].sum(keepdims=True))


def misc_cases(c):
    # the exponent an activation (an exponent that is an initializer is a constant: autodiff's default rule)
    c["Pow_both"] = ([node("Identity", ["B0"], ["B"]), node("Pow", ["A", "B"], ["Y"])], {"A": pos(3, 4), "B0": r(4)},
                     lambda w: w["A"] ** w["B0"])
    c["Pow_const_exponent"] = ([node("Pow", ["A", "e"], ["Y"])], {"A": r(3, 4), "e": const("e", 3.0)},
                               lambda w: w["A"] ** 3)
    c["Softmax"] = ([node("Softmax", ["X"], ["Y"])], {"X": r(3, 5)}, lambda w: softmax(w["X"], -1))
    c["LogSoftmax_axis1"] = ([node("LogSoftmax", ["X"], ["Y"], axis=1)], {"X": r(2, 4, 3)},
                             lambda w: np.log(softmax(w["X"], 1)))
    attention_cases(c)
    for name, ratio, train in (("Dropout_ratio0", 0.0, True), ("Dropout_ratio0.3", 0.3, None)):
        ins = ["X", "ratio"] + (["train"] if train is not None else [])
        wts = {"X": r(5, 7), "ratio": const("ratio", ratio), "train": const("train", True, np.bool_)}
        if ratio == 0:
            f = lambda w: w["X"].copy()
        else:
            mask = dropout_mask(35, ratio, "drop").reshape(5, 7)
            f = (lambda m, s: lambda w: w["X"] * m * s)(mask, 1.0 / (1.0 - ratio))
        c[name] = ([node("Dropout", ins, ["Y"], name="drop")], wts, f)


def attention_cases(c):
    """Scaled dot-product attention as exported graphs write it, which passes/attention.c makes one
    FusedAttention: q [2,3,4,5], k [2,3,6,5] (transposed by the graph), v [2,3,6,4]; a causal mask (a bool
    constant, the diagonal offset 2) through Where, or an additive bias per batch, shared by the heads
    (Cast(mask) * -30, nbias 2, brep 3), and the scale as Mul or Div"""
    causal = np.triu(np.ones((4, 6), np.bool_), k=3)[None, None]
    pad = rng.random((2, 1, 4, 6)) < 0.3
    pad[..., 0] = False  # every row sees something

    def ref(w, bias):
        s = w["Q"] @ w["K"].transpose(0, 1, 3, 2) / np.sqrt(5.0) + bias
        return softmax(s, -1) @ w["V"]
    qkv = {"Q": r(2, 3, 4, 5), "K": r(2, 3, 6, 5), "V": r(2, 3, 6, 4)}
    head = [node("Transpose", ["K"], ["KT"], perm=[0, 1, 3, 2]), node("MatMul", ["Q", "KT"], ["S0"])]
    tail = [node("Softmax", ["S2"], ["P"], axis=-1), node("MatMul", ["P", "V"], ["Y"])]
    c["Attention_fused_causal"] = (
        head + [node("Mul", ["S0", "c"], ["S1"]), node("Where", ["M", "ninf", "S1"], ["S2"])] + tail,
        {**qkv, "c": const("c", 1 / np.sqrt(5.0)), "ninf": const("ninf", -np.inf),
         "M": numpy_helper.from_array(causal, "M")},
        lambda w: ref(w, np.where(causal, -np.inf, 0.0)))
    c["Attention_fused_bias"] = (
        head + [node("Div", ["S0", "c"], ["S1"]), node("Cast", ["M"], ["Mf"], to=TensorProto.DOUBLE),
                node("Mul", ["Mf", "neg"], ["B"]), node("Add", ["S1", "B"], ["S2"])] + tail,
        {**qkv, "c": const("c", np.sqrt(5.0)), "neg": const("neg", -30.0), "M": numpy_helper.from_array(pad, "M")},
        lambda w: ref(w, pad * -30.0))
    # a learned bias (T5's relative positions): a parameter per head, its gradient from FusedAttentionGrad's
    # dbias; alone, and plus a padding mask (two Adds, the biases summed into one [2,3,4,6]: nbias 6)
    c["Attention_fused_learned_bias"] = (
        head + [node("Mul", ["S0", "c"], ["S1"]), node("Add", ["S1", "PB"], ["S2"])] + tail,
        {**qkv, "c": const("c", 1 / np.sqrt(5.0)), "PB": r(3, 4, 6)},
        lambda w: ref(w, w["PB"]))
    c["Attention_fused_learned_bias_mask"] = (
        head + [node("Add", ["S0", "PB"], ["S1"]), node("Cast", ["M"], ["Mf"], to=TensorProto.DOUBLE),
                node("Mul", ["Mf", "neg"], ["B"]), node("Add", ["S1", "B"], ["S2"])] + tail,
        {**qkv, "PB": r(1, 3, 4, 6), "neg": const("neg", -30.0), "M": numpy_helper.from_array(pad, "M")},
        lambda w: softmax(w["Q"] @ w["K"].transpose(0, 1, 3, 2) + w["PB"] + pad * -30.0, -1) @ w["V"])


def gqa_attention_cases(c):
    """Grouped-query and multi-query attention, which passes/attention.c fuses with the K/V heads read in place
    (kvrep): q [2,4,4,5] against k [2,2,6,5], v [2,2,6,4] repeated by Hugging Face's repeat_kv (Unsqueeze,
    Expand, Reshape) under a causal mask; k [2,1,6,5], v [2,1,6,4] broadcast over the 4 heads by the MatMuls
    (Falcon's multi-query) with a padding bias per batch; and repeat_kv with a clone (Identity, as dynamo exports
    Qwen2's) and a learned bias per query head (its dbias summed across the K/V groups)"""
    causal = np.triu(np.ones((4, 6), np.bool_), k=3)[None, None]
    pad = rng.random((2, 1, 4, 6)) < 0.3
    pad[..., 0] = False  # every row sees something
    i64 = lambda name, v: const(name, v, np.int64)
    shapes = {"ax2": i64("ax2", [2]), "e5": i64("e5", [2, 2, 2, 6, 5]), "r5": i64("r5", [2, 4, 6, 5]),
              "e4": i64("e4", [2, 2, 2, 6, 4]), "r4": i64("r4", [2, 4, 6, 4])}

    def repeat_kv(x, d, clone=False):  # x [2,2,6,d] -> x + "R" [2,4,6,d]
        return [node("Unsqueeze", [x, "ax2"], [x + "u"]), node("Expand", [x + "u", "e%d" % d], [x + "e"])] + (
            [node("Identity", [x + "e"], [x + "c"])] if clone else []) + [
            node("Reshape", [x + ("c" if clone else "e"), "r%d" % d], [x + "R"])]

    def ref(w, bias, rep=2):
        k, v = np.repeat(w["K"], rep, axis=1), np.repeat(w["V"], rep, axis=1)
        return softmax(w["Q"] @ k.transpose(0, 1, 3, 2) / np.sqrt(5.0) + bias, -1) @ v
    scores = [node("Transpose", ["KR"], ["KT"], perm=[0, 1, 3, 2]), node("MatMul", ["Q", "KT"], ["S0"])]
    head = repeat_kv("K", 5) + repeat_kv("V", 4) + scores
    tail = [node("Softmax", ["S2"], ["P"], axis=-1), node("MatMul", ["P", "VR"], ["Y"])]
    gqa = {"Q": r(2, 4, 4, 5), "K": r(2, 2, 6, 5), "V": r(2, 2, 6, 4), **shapes}
    c["Attention_fused_gqa_repeat_causal"] = (
        head + [node("Mul", ["S0", "c"], ["S1"]), node("Where", ["M", "ninf", "S1"], ["S2"])] + tail,
        {**gqa, "c": const("c", 1 / np.sqrt(5.0)), "ninf": const("ninf", -np.inf),
         "M": numpy_helper.from_array(causal, "M")},
        lambda w: ref(w, np.where(causal, -np.inf, 0.0)))
    c["Attention_fused_mqa_broadcast"] = (
        [node("Transpose", ["K"], ["KT"], perm=[0, 1, 3, 2]), node("MatMul", ["Q", "KT"], ["S0"]),
         node("Div", ["S0", "c"], ["S1"]), node("Cast", ["M"], ["Mf"], to=TensorProto.DOUBLE),
         node("Mul", ["Mf", "neg"], ["B"]), node("Add", ["S1", "B"], ["S2"]), node("Softmax", ["S2"], ["P"], axis=-1),
         node("MatMul", ["P", "V"], ["Y"])],
        {"Q": r(2, 4, 4, 5), "K": r(2, 1, 6, 5), "V": r(2, 1, 6, 4), "c": const("c", np.sqrt(5.0)),
         "neg": const("neg", -30.0), "M": numpy_helper.from_array(pad, "M")},
        lambda w: ref(w, pad * -30.0, 1))
    c["Attention_fused_gqa_learned_bias"] = (
        repeat_kv("K", 5, True) + repeat_kv("V", 4, True) + scores + [node("Mul", ["S0", "c"], ["S1"]), node("Add", ["S1", "PB"], ["S2"])] + tail,
        {**gqa, "c": const("c", 1 / np.sqrt(5.0)), "PB": r(4, 4, 6)},
        lambda w: ref(w, w["PB"]))


def check_fused(fsdpc, work, name):
    """the case's model compiles to one FusedAttention (not the unfused chain); a grouped-query or multi-query one
    with its K/V heads read in place (kvrep), no Expand left"""
    out = run([fsdpc, os.path.join(work, name + ".onnx"), "--target", "cpu", "--loss", "mse:Y,T", "--dump-after",
               "attention"]).stdout.split("nodes:")[1]
    check(out.count("= FusedAttention ") == 1 and "= Softmax " not in out and "= Expand " not in out and
          ("_gqa_" not in name and "_mqa_" not in name or " kvrep=" in out), "%s: not fused:\n%s" % (name, out))


def affine_grid_ref(theta, size, align):
    """ONNX AffineGrid, 2-D: the base grid [x, y, 1] over H x W times theta^T"""
    n, _, h, w = size
    lin = lambda k: np.linspace(-1, 1, k) if align else (2 * np.arange(k) + 1) / k - 1
    gy, gx = np.meshgrid(lin(h), lin(w), indexing="ij")
    base = np.stack([gx, gy, np.ones_like(gx)], -1).reshape(-1, 3)
    return (base @ theta.transpose(0, 2, 1)).reshape(n, h, w, 2)


def group_norm_ref(x, scale, bias, groups, eps, per_group=False):
    n, ch = x.shape[:2]
    g = x.reshape(n, groups, -1)
    y = (g - g.mean(2, keepdims=True)) / np.sqrt(g.var(2, keepdims=True) + eps)
    if per_group:
        return (y * scale[:, None] + bias[:, None]).reshape(x.shape)
    sh = (1, ch) + (1,) * (x.ndim - 2)
    return y.reshape(x.shape) * scale.reshape(sh) + bias.reshape(sh)


def grid_sample_ref(x, grid, mode="linear", pad="zeros", align=0):
    """ONNX GridSample, 2-D, written out per output pixel as onnx's reference computes it"""
    n, ch, h, w = x.shape
    ho, wo = grid.shape[1:3]
    y = np.zeros((n, ch, ho, wo))
    dims = (w, h)
    lo = [0.0 if align else -0.5] * 2
    hi = [d - 1.0 if align else d - 0.5 for d in dims]

    def reflect(v, a, b):
        span = b - a
        if span <= 0:
            return 0.0
        m = np.mod(v - a, 2 * span)
        return a + (m if m <= span else 2 * span - m)

    def pixel(b, yy, xx):
        idx = []
        for v, d, k in ((xx, w, 0), (yy, h, 1)):
            if pad == "zeros" and not 0 <= v < d:
                return np.zeros(ch)
            if pad == "border":
                v = min(max(v, 0), d - 1)
            if pad == "reflection":
                v = int(reflect(v, lo[k], hi[k]))
            idx.append(int(v))
        return x[b, :, idx[1], idx[0]]

    for b in range(n):
        for i in range(ho):
            for j in range(wo):
                co = []
                for k, gv in enumerate(grid[b, i, j]):
                    d = dims[k]
                    v = (gv + 1) / 2 * (d - 1) if align else ((gv + 1) * d - 1) / 2
                    if mode == "nearest":
                        v = np.rint(v)
                    if pad == "border" and not lo[k] <= v <= hi[k]:
                        v = min(max(v, 0), d - 1)
                    if pad == "reflection" and not lo[k] <= v <= hi[k]:
                        v = reflect(v, lo[k], hi[k])
                    co.append(v)
                if mode == "nearest":
                    y[b, :, i, j] = pixel(b, int(co[1]), int(co[0]))
                    continue
                x0, y0 = int(np.floor(co[0])), int(np.floor(co[1]))
                fx, fy = co[0] - x0, co[1] - y0
                y[b, :, i, j] = ((1 - fy) * ((1 - fx) * pixel(b, y0, x0) + fx * pixel(b, y0, x0 + 1)) +
                                 fy * ((1 - fx) * pixel(b, y0 + 1, x0) + fx * pixel(b, y0 + 1, x0 + 1)))
    return y


def more_composed_cases(c):
    """compose.c's small compositions, each against NumPy"""
    eps = 2.0 ** -8
    c["PRelu_channel_slope"] = ([node("PRelu", ["X", "S"], ["Y"])], {"X": r(2, 3, 4), "S": r(3, 1)},
                                lambda w: np.where(w["X"] < 0, w["X"] * w["S"], w["X"]))
    c["Swish_alpha"] = ([node("Swish", ["X"], ["Y"], alpha=0.75)], {"X": r(2, 5)},
                        lambda w: w["X"] / (1 + np.exp(-0.75 * w["X"])))
    c["Shrink_soft"] = ([node("Shrink", ["X"], ["Y"], lambd=0.5, bias=0.25)], {"X": r(3, 4)},
                        lambda w: np.where(w["X"] < -0.5, w["X"] + 0.25, np.where(w["X"] > 0.5, w["X"] - 0.25, 0)))
    c["LpNormalization_p2_axis0"] = ([node("LpNormalization", ["X"], ["Y"], axis=0, p=2)], {"X": r(3, 4)},
                                     lambda w: w["X"] / np.sqrt((w["X"] ** 2).sum(0, keepdims=True)))
    c["LpNormalization_p1"] = ([node("LpNormalization", ["X"], ["Y"], p=1)], {"X": r(2, 5)},
                               lambda w: w["X"] / np.abs(w["X"]).sum(-1, keepdims=True))
    c["InstanceNormalization"] = ([node("InstanceNormalization", ["X", "S", "B"], ["Y"], epsilon=eps)],
                                  {"X": r(2, 3, 4, 2), "S": r(3), "B": r(3)},
                                  lambda w: group_norm_ref(w["X"], w["S"], w["B"], 3, eps))
    c["GroupNormalization_21"] = ([node("GroupNormalization", ["X", "S", "B"], ["Y"], num_groups=2, epsilon=eps)],
                                  {"X": r(2, 4, 3), "S": r(4), "B": r(4)},
                                  lambda w: group_norm_ref(w["X"], w["S"], w["B"], 2, eps))
    c["GroupNormalization_18_per_group"] = (
        [node("GroupNormalization", ["X", "S", "B"], ["Y"], num_groups=2, epsilon=eps)],
        {"X": r(2, 6, 2, 2), "S": r(2), "B": r(2)},
        lambda w: group_norm_ref(w["X"], w["S"], w["B"], 2, eps, per_group=True))
    c["SpaceToDepth_DepthToSpace_CRD"] = (
        [node("SpaceToDepth", ["X"], ["Z"], blocksize=2), node("Mul", ["Z", "K"], ["Z2"]),
         node("DepthToSpace", ["Z2"], ["Y"], blocksize=2, mode="CRD")], {"X": r(1, 2, 4, 6), "K": r(1, 8, 1, 1)},
        lambda w: depth_to_space_crd(space_to_depth(w["X"], 2) * w["K"], 2))
    c["CenterCropPad_crop_and_pad"] = (
        [node("CenterCropPad", ["X", "sh"], ["Y"], axes=[1, 2])], {"X": r(2, 7, 3), "sh": const("sh", [4, 6], np.int64)},
        lambda w: np.pad(w["X"][:, 1:5], ((0, 0), (0, 0), (1, 2))))
    # GridSample: the grid reaches past the image (1.3) so that taps fall outside it
    for mode, pad, align in (("linear", "zeros", 0), ("linear", "reflection", 1), ("linear", "border", 0),
                             ("nearest", "reflection", 0)):
        c["GridSample_%s_%s_ac%d" % (mode, pad, align)] = (
            [node("GridSample", ["X", "G"], ["Y"], mode=mode, padding_mode=pad, align_corners=align)],
            {"X": r(2, 2, 3, 4), "G": np.clip(0.8 * r(2, 3, 2, 2), -1.3, 1.3)},
            (lambda mode, pad, align: lambda w: grid_sample_ref(w["X"], w["G"], mode, pad, align))(mode, pad, align))
    c["SwiGLU"] = ([node("SwiGLU", ["A", "B"], ["Y"], alpha=1.5)], {"A": r(2, 4), "B": r(2, 4)},
                   lambda w: w["A"] / (1 + np.exp(-1.5 * w["A"])) * w["B"])

    def lrn_ref(x, size, alpha, beta, bias):
        sq = np.pad(x * x, ((0, 0), ((size - 1) // 2, size // 2), (0, 0), (0, 0)))
        s = sum(sq[:, i:i + x.shape[1]] for i in range(size))
        return x / (bias + alpha / size * s) ** beta
    c["LRN_size4"] = ([node("LRN", ["X"], ["Y"], size=4, alpha=0.5, beta=0.75, bias=2.0)], {"X": r(2, 5, 2, 3)},
                      lambda w: lrn_ref(w["X"], 4, 0.5, 0.75, 2.0))

    def reverse_ref(x, lens):  # time axis 0, batch axis 1
        y = x.copy()
        for b, n in enumerate(lens):
            y[:n, b] = x[:n, b][::-1]
        return y
    c["ReverseSequence_time_major"] = (
        [node("ReverseSequence", ["X", "L"], ["Y"], batch_axis=1, time_axis=0)],
        {"X": r(4, 3, 2), "L": const("L", [4, 0, 2], np.int64)}, lambda w: reverse_ref(w["X"], [4, 0, 2]))
    # MatMul with a 1-D operand (numpy's promotion): vector x batch of matrices, batch of matrices x vector
    c["MatMul_vector_left"] = ([node("MatMul", ["A", "B"], ["Y"])], {"A": r(3), "B": r(2, 3, 4)},
                               lambda w: np.matmul(w["A"], w["B"]))
    c["MatMul_vector_right"] = ([node("MatMul", ["A", "B"], ["Y"])], {"A": r(2, 3, 4), "B": r(4)},
                                lambda w: np.matmul(w["A"], w["B"]))
    c["AffineGrid_2d"] = ([node("AffineGrid", ["Th", "size"], ["Y"], align_corners=0)],
                          {"Th": r(2, 2, 3), "size": const("size", [2, 1, 3, 4], np.int64)},
                          lambda w: affine_grid_ref(w["Th"], (2, 1, 3, 4), 0))


def space_to_depth(x, b):
    n, ch, h, w = x.shape
    return x.reshape(n, ch, h // b, b, w // b, b).transpose(0, 3, 5, 1, 2, 4).reshape(n, ch * b * b, h // b, w // b)


def depth_to_space_crd(x, b):
    n, ch, h, w = x.shape
    return x.reshape(n, ch // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3).reshape(n, ch // (b * b), h * b, w * b)


def composed_cases(c):
    """the ops fold writes as others (passes/compose.c): the reductions over ReduceSum, Sum and Mean as Adds"""
    lse = lambda x, ax, k: np.log(np.exp(x).sum(ax, keepdims=k))
    for op, f in (("ReduceL1", lambda x, ax, k: np.abs(x).sum(ax, keepdims=k)),
                  ("ReduceL2", lambda x, ax, k: np.sqrt((x * x).sum(ax, keepdims=k))),
                  ("ReduceSumSquare", lambda x, ax, k: (x * x).sum(ax, keepdims=k)),
                  ("ReduceLogSum", lambda x, ax, k: np.log(x.sum(ax, keepdims=k))),
                  ("ReduceLogSumExp", lse)):
        for axes, keep in (([1], 1), ([0, 2], 0)):
            x = pos(2, 3, 4) if op in ("ReduceLogSum", "ReduceL1") else r(2, 3, 4)
            c["%s_%s_k%d" % (op, "_".join(map(str, axes)), keep)] = (
                [node(op, ["X"], ["Y"], axes=axes, keepdims=keep)], {"X": x},
                (lambda f, ax, k: lambda w: f(w["X"], tuple(ax), bool(k)))(f, axes, keep))
    # large inputs: the max shift keeps it finite (exp(800) overflows); 800 taken off after, so that the loss
    # stays near 1 and its finite differences well inside the tolerance
    c["ReduceLogSumExp_large"] = ([node("ReduceLogSumExp", ["X"], ["Z"], axes=[1], keepdims=0),
                                   node("Sub", ["Z", "c800"], ["Y"])],
                                  {"X": r(2, 3) + 800.0, "c800": const("c800", np.array(800.0))},
                                  lambda w: lse(w["X"] - 800.0, (1,), False))
    c["Sum3"] = ([node("Sum", ["A", "B", "C"], ["Y"])], {"A": r(2, 3), "B": r(3), "C": r(2, 1)},
                 lambda w: w["A"] + w["B"] + w["C"])
    c["Mean3"] = ([node("Mean", ["A", "B", "C"], ["Y"])], {"A": r(2, 3), "B": r(3), "C": r(2, 1)},
                  lambda w: (w["A"] + w["B"] + w["C"]) / 3)


def gelu_cases(c):
    """GELU as exporters compose it, which passes/gelu.c makes one Gelu node (GELU_FORMS: erf with x / sqrt 2 and
    0.5 last, as TorchScript's nn.GELU; erf with x * (1/sqrt 2), 0.5 first, operands swapped; tanh with Pow(x, 3)
    and 0.5 first, Hugging Face's gelu_new; tanh with x * (x * x) and 0.5 last, TorchScript's F.gelu tanh), and
    two that stay composed (GELU_KEPT: sqrt 2 written 1.5; the Erf also read by the output)"""
    erf = np.vectorize(__import__("math").erf)
    x = {"X": 2 * r(3, 4)}
    k = {"s2": const("s2", np.sqrt(2.0)), "is2": const("is2", 1 / np.sqrt(2.0)), "one": const("one", 1.0),
         "half": const("half", 0.5), "beta": const("beta", np.sqrt(2 / np.pi)), "kappa": const("kappa", 0.044715),
         "three": const("three", 3.0), "bad": const("bad", 1.5)}
    gelu = lambda a: 0.5 * a * (1 + erf(a / np.sqrt(2)))
    gelu_tanh = lambda a: 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3)))
    erf_div = [node("Div", ["X", "s2"], ["D"]), node("Erf", ["D"], ["E"]), node("Add", ["E", "one"], ["A"]),
               node("Mul", ["X", "A"], ["M"])]
    c["Gelu_composed_erf_div"] = (erf_div + [node("Mul", ["M", "half"], ["Y"])], {**x, **k}, lambda w: gelu(w["X"]))
    c["Gelu_composed_erf_mul"] = (
        [node("Mul", ["is2", "X"], ["D"]), node("Erf", ["D"], ["E"]), node("Add", ["one", "E"], ["A"]),
         node("Mul", ["half", "X"], ["H"]), node("Mul", ["H", "A"], ["Y"])], {**x, **k}, lambda w: gelu(w["X"]))
    c["Gelu_composed_tanh_pow"] = (
        [node("Mul", ["X", "half"], ["H"]), node("Pow", ["X", "three"], ["P"]), node("Mul", ["P", "kappa"], ["W"]),
         node("Add", ["X", "W"], ["S"]), node("Mul", ["S", "beta"], ["U"]), node("Tanh", ["U"], ["TH"]),
         node("Add", ["TH", "one"], ["A"]), node("Mul", ["H", "A"], ["Y"])], {**x, **k}, lambda w: gelu_tanh(w["X"]))
    c["Gelu_composed_tanh_cube"] = (
        [node("Mul", ["X", "X"], ["Q"]), node("Mul", ["X", "Q"], ["C"]), node("Mul", ["kappa", "C"], ["W"]),
         node("Add", ["W", "X"], ["S"]), node("Mul", ["beta", "S"], ["U"]), node("Tanh", ["U"], ["TH"]),
         node("Add", ["one", "TH"], ["A"]), node("Mul", ["X", "A"], ["M"]), node("Mul", ["half", "M"], ["Y"])],
        {**x, **k}, lambda w: gelu_tanh(w["X"]))
    c["Gelu_kept_constant"] = (
        [node("Div", ["X", "bad"], ["D"])] + erf_div[1:] + [node("Mul", ["M", "half"], ["Y"])], {**x, **k},
        lambda w: 0.5 * w["X"] * (1 + erf(w["X"] / 1.5)))
    c["Gelu_kept_reader"] = (
        erf_div + [node("Mul", ["M", "half"], ["G"]), node("Add", ["G", "E"], ["Y"])], {**x, **k},
        lambda w: gelu(w["X"]) + erf(w["X"] / np.sqrt(2)))


GELU_FORMS = ("Gelu_composed_erf_div", "Gelu_composed_erf_mul", "Gelu_composed_tanh_pow", "Gelu_composed_tanh_cube")
GELU_KEPT = ("Gelu_kept_constant", "Gelu_kept_reader")


def check_gelu(fsdpc, work, name, spec):
    """the case's model after the gelu pass: one Gelu and no Erf / Tanh (GELU_FORMS), or no Gelu (GELU_KEPT);
    a GELU_FORMS case's step also equals the composed one's (--no-fuse leaves the chain as it is): the loss and
    the weights after one SGD step (lr 1) within 1e-12"""
    out = run([fsdpc, os.path.join(work, name + ".onnx"), "--target", "cpu", "--loss", "mse:Y,T", "--dump-after",
               "gelu"]).stdout.split("nodes:")[1]
    if name in GELU_KEPT:
        check("= Gelu " not in out, "%s: rewritten, though it is no GELU:\n%s" % (name, out))
        return
    check(out.count("= Gelu ") == 1 and "= Erf " not in out and "= Tanh " not in out,
          "%s: not rewritten into Gelu:\n%s" % (name, out))
    nodes, weights = spec[:2]
    y_shape, data = [3, 4], "T=" + os.path.join(work, name + ".t.npy")
    got = [compile_run(fsdpc, work, name + tag, nodes, weights, y_shape, "mse:Y,T", data, 1.0, flags=flags)
           for tag, flags in ((".gelu", []), (".composed", ["--no-fuse"]))]
    (l1, w1), (l2, w2) = got
    check(abs(l1 - l2) <= 1e-12 * max(1.0, abs(l2)), "%s: loss %.17g, composed %.17g" % (name, l1, l2))
    err = float(np.max(np.abs(w1["X"] - w2["X"])))
    check(err <= 1e-12 * max(1.0, float(np.max(np.abs(w2["X"])))), "%s: weights after a step %.3g from the "
          "composed graph's" % (name, err))


def cases():
    c = {}
    misc_cases(c)
    conv_cases(c)
    norm_cases(c)
    pool_cases(c)
    recurrent_cases(c)
    more_composed_cases(c)
    reduce_cases(c)
    composed_cases(c)
    conv_transpose_cases(c)
    gqa_attention_cases(c)
    gelu_cases(c)  # last: the cases before keep the random data and directions they had
    return c


# ---- BatchNormalization's running statistics ---------------------------------

def check_running_stats(fsdpc, work):
    eps, mom = 2.0 ** -8, 0.75
    x, rm, rv = r(4, 3, 2, 2), r(3), pos(3)
    nodes = [node("BatchNormalization", ["X", "S", "Bb", "rm", "rv"], ["Y"], epsilon=eps, momentum=mom,
                  training_mode=1)]
    w = {"X": x, "S": pos(3), "Bb": r(3), "rm": const("rm", rm), "rv": const("rv", rv)}
    np.save(os.path.join(work, "bnstats.t.npy"), r(4, 3, 2, 2))
    _, out = compile_run(fsdpc, work, "bnstats", nodes, w, [4, 3, 2, 2], "mse:Y,T",
                         "T=" + os.path.join(work, "bnstats.t.npy"), 0.0)
    ax = (0, 2, 3)
    want_m = mom * rm + (1 - mom) * x.mean(ax)
    want_v = mom * rv + (1 - mom) * x.var(ax, ddof=1)
    for k, want in (("rm", want_m), ("rv", want_v)):
        check(np.allclose(out[k], want, rtol=1e-13, atol=1e-15),
              "BatchNorm running stat %s exported %s, NumPy %s" % (k, out[k], want))
    print("ok %-22s running mean/var exported as NumPy's update" % "BatchNorm_running_stats")


# ---- SoftmaxCrossEntropyLoss as the model's own loss --------------------------

def sce_model(path, w, lshape, attrs, weights, nll):
    ins = ["LP" if nll else "Z", "T"] + (["Wt"] if weights is not None else [])
    nodes = [node("MatMul", ["A", "B"], ["Z0"]), node("Transpose", ["Z0"], ["Z"], perm=[0, 2, 1])
             if len(lshape) == 2 else node("Identity", ["Z0"], ["Z"])]
    if nll:
        nodes.append(node("LogSoftmax", ["Z"], ["LP"], axis=1))
    nodes.append(node("NegativeLogLikelihoodLoss" if nll else "SoftmaxCrossEntropyLoss", ins, ["loss"], **attrs))
    inits = [numpy_helper.from_array(v, k) for k, v in w.items()]
    if weights is not None:
        inits.append(const("Wt", weights))
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("T", TensorProto.INT64, list(lshape))],
                          [helper.make_tensor_value_info("loss", TensorProto.DOUBLE, [])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def sce_run(fsdpc, work, tag, w, lshape, attrs, weights, nll, labels_file, lr):
    path = os.path.join(work, tag + ".onnx")
    sce_model(path, w, lshape, attrs, weights, nll)
    exe = os.path.join(work, tag)
    run([fsdpc, path, "-o", exe, "--target", "cpu", "--optimizer", "sgd", "--verify"])
    m, out = exe + ".jsonl", exe + ".out.onnx"
    run([exe, "--data", "T=" + labels_file, "--steps", "1", "--lr", str(lr), "--momentum", "0",
         "--weight-decay", "0", "--metrics", m, "--export-onnx", out, "--quiet"])
    return read_metrics(m)[0][0], onnx_weights(out)


def check_sce(fsdpc, work, name, seq, attrs, weights=None, nll=False):
    n, k, c = 4, 3, 5
    a_shape = (n, seq, k) if seq else (n, k)
    w0 = {"A": r(*a_shape), "B": r(k, c)}
    lshape = (n, seq) if seq else (n,)
    labels = rng.integers(0, c, size=lshape)
    ii = attrs.get("ignore_index")
    if ii is not None:
        labels.flat[::3] = ii
    lf = os.path.join(work, name + ".t.npy")
    np.save(lf, labels.astype(np.int64))

    def fwd(w):
        z = w["A"] @ w["B"]
        z = z.transpose(0, 2, 1) if seq else z
        return sce_ref(z, labels, weights, ii, attrs.get("reduction", "mean"))
    l0, w1 = sce_run(fsdpc, work, name, w0, lshape, attrs, weights, nll, lf, 1.0)
    ref = fwd(w0)
    check(abs(l0 - ref) <= 1e-12 * max(1.0, abs(ref)), "%s: forward loss %.17g, NumPy %.17g" % (name, l0, ref))
    grads = {key: w0[key] - w1[key] for key in w0}
    h = 1e-6
    for _ in range(2):
        d = {key: rng.standard_normal(v.shape) for key, v in w0.items()}
        lp, _ = sce_run(fsdpc, work, name + ".p", {key: w0[key] + h * d[key] for key in w0}, lshape, attrs,
                        weights, nll, lf, 0.0)
        lm, _ = sce_run(fsdpc, work, name + ".m", {key: w0[key] - h * d[key] for key in w0}, lshape, attrs,
                        weights, nll, lf, 0.0)
        fd, an = (lp - lm) / (2 * h), sum(float(np.sum(grads[key] * d[key])) for key in w0)
        check(abs(fd - an) <= 1e-6 * max(1.0, abs(an)), "%s: directional derivative %.12g, finite differences "
              "%.12g" % (name, an, fd))
    print("ok %-22s loss %.6f (the model's own loss)" % (name, l0))


SCE_CASES = {
    "SCE_mean": (0, {}),
    "SCE_mean_ignore_index_3d": (3, {"ignore_index": 2}),
    "SCE_sum_weights": (0, {"reduction": "sum"}, np.array([0.5, 1.0, 2.0, 1.5, 0.25])),
    "SCE_mean_weights_ignore": (2, {"ignore_index": 1}, np.array([0.5, 1.0, 2.0, 1.5, 0.25])),
    "NLL_logsoftmax_ignore": (2, {"ignore_index": 3}, np.array([0.5, 1.0, 2.0, 1.5, 0.25]), True),
    "NLL_sum": (0, {"reduction": "sum"}, None, True),
}


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    all_cases = cases()
    extra = ["BatchNorm_running_stats"] + list(SCE_CASES)
    names = sys.argv[3:] or list(all_cases) + extra
    for n in names:
        check(n in all_cases or n in extra, "no case " + n)
        if n == "BatchNorm_running_stats":
            check_running_stats(fsdpc, work)
        elif n in SCE_CASES:
            check_sce(fsdpc, work, n, *SCE_CASES[n])
        else:
            check_case(fsdpc, work, n, all_cases[n])
            if n.startswith("Attention_fused"):
                check_fused(fsdpc, work, n)
            if n.startswith("Gelu_"):
                check_gelu(fsdpc, work, n, all_cases[n])
    print("OK gradcheck_nn: %d cases" % len(names))


if __name__ == "__main__":
    main()
