"""3-D Conv, ConvTranspose, MaxPool, AveragePool and LpPool (passes/lift3d.c), GridSample's cubic mode and 3-D
grids (passes/gridsample.c) against NumPy, in float64 and float32.

usage: gradcheck_3d.py FSDPC WORKDIR [CASE...]

float64: gradcheck.py's method (the forward loss = a NumPy reference, the gradient of one SGD step with lr 1 = central
finite differences along random directions).  float32: the same model with float32 tensors; its loss must match
the reference within float32's rounding and its gradient the float64 run's within 1e-4 of the largest element (the
composition sums per depth tap and through 2-D kernels: a lost tap, a misplaced one or a float32-only path shows
far beyond that).
"""
import itertools
import os
import sys

import numpy as np
import onnx
from onnx import helper, numpy_helper, TensorProto

from common import check, onnx_weights, read_metrics, run
import gradcheck
from gradcheck import check_case, r
from gradcheck_nn import conv_case, out_dim

gradcheck.NEWER_OPS["AveragePool"] = 19  # its dilations (this process only)

node = helper.make_node


# ---- NumPy references (N, C, D, H, W) -------------------------------------------

def taps(ks):
    return itertools.product(*[range(k) for k in ks])


def conv3_ref(x, w, b, s, p, d, group):
    m, cg, ks = w.shape[0], w.shape[1], w.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0)) + tuple((p[i], p[i + 3]) for i in range(3)))
    out = [(xp.shape[2 + i] - d[i] * (ks[i] - 1) - 1) // s[i] + 1 for i in range(3)]
    y = np.zeros((x.shape[0], m, *out))
    mg = m // group
    for gi in range(group):
        for t in taps(ks):
            sl = tuple(slice(t[i] * d[i], t[i] * d[i] + s[i] * (out[i] - 1) + 1, s[i]) for i in range(3))
            patch = xp[(slice(None), slice(gi * cg, (gi + 1) * cg)) + sl]
            wt = w[gi * mg:(gi + 1) * mg, :, t[0], t[1], t[2]]
            y[:, gi * mg:(gi + 1) * mg] += np.einsum("ncdhw,mc->nmdhw", patch, wt)
    return y if b is None else y + b[None, :, None, None, None]


def convt3_ref(x, w, b, s, p, d, group, op):
    """each input voxel scatters x * w into the output; pads cut its border off, output padding adds to its end"""
    c, mg, ks, ins = x.shape[1], w.shape[1], w.shape[2:], x.shape[2:]
    full = [s[i] * (ins[i] - 1) + op[i] + d[i] * (ks[i] - 1) + 1 for i in range(3)]
    y = np.zeros((x.shape[0], mg * group, *full))
    cg = c // group
    for gi in range(group):
        for t in taps(ks):
            sl = tuple(slice(t[i] * d[i], t[i] * d[i] + s[i] * (ins[i] - 1) + 1, s[i]) for i in range(3))
            y[(slice(None), slice(gi * mg, (gi + 1) * mg)) + sl] += np.einsum(
                "ncdhw,cm->nmdhw", x[:, gi * cg:(gi + 1) * cg], w[gi * cg:(gi + 1) * cg, :, t[0], t[1], t[2]])
    y = y[(slice(None), slice(None)) + tuple(slice(p[i], full[i] - p[i + 3]) for i in range(3))]
    return y if b is None else y + b[None, :, None, None, None]


def pool3_ref(x, k, s, p, d, ceil, kind, cip=0, lp=2):
    """kind max, avg (cip: count_include_pad) or lp (the lp-norm of each window, pads 0)"""
    ins = x.shape[2:]
    out = [out_dim(ins[i], k[i], s[i], p[i], p[i + 3], d[i], ceil) for i in range(3)]
    y = np.zeros(x.shape[:2] + tuple(out))
    for o in itertools.product(*[range(v) for v in out]):
        pos = [[o[i] * s[i] - p[i] + j * d[i] for j in range(k[i])] for i in range(3)]
        inside = [[t for t in pos[i] if 0 <= t < ins[i]] for i in range(3)]
        win = x[:, :, inside[0]][:, :, :, inside[1]][:, :, :, :, inside[2]]
        if kind == "max":
            v = win.max((2, 3, 4))
        elif kind == "lp":
            v = (np.abs(win) ** lp).sum((2, 3, 4)) ** (1.0 / lp)
        else:
            div = np.prod([sum(-p[i] <= t < ins[i] + p[i + 3] for t in pos[i]) if cip else len(inside[i])
                           for i in range(3)])
            v = win.sum((2, 3, 4)) / div
        y[(slice(None), slice(None)) + o] = v
    return y


def keys_cubic(t):
    """the weights of the taps floor - 1 .. floor + 2 at t = x - floor (onnx's reference, A = -0.75)"""
    a = -0.75
    outer = lambda z: ((a * z - 5 * a) * z + 8 * a) * z - 4 * a
    inner = lambda z: ((a + 2) * z - (a + 3)) * z * z + 1
    return [outer(t + 1), inner(t), inner(1 - t), outer(2 - t)]


def grid_sample_ref(x, grid, mode, pad, align):
    """ONNX GridSample in 2-D or 3-D, per output point as onnx's reference computes it (its coordinates in float64)"""
    ns = x.ndim - 2
    dims = x.shape[2:][::-1]  # the grid's order: x (W), y (H), z (D)
    lo = [0.0 if align else -0.5] * ns
    hi = [d - 1.0 if align else d - 0.5 for d in dims]

    def reflect(v, a, b):  # onnx's _gs_reflect
        rng_ = b - a
        if v < a:
            dx = a - v
            n = int(dx / rng_)
            rr = dx - n * rng_
            return a + rr if n % 2 == 0 else b - rr
        if v > b:
            dx = v - b
            n = int(dx / rng_)
            rr = dx - n * rng_
            return b - rr if n % 2 == 0 else a + rr
        return v

    def index(i, k):  # the tap i of axis k: an index, or None (zeros outside)
        if pad == "zeros":
            return i if 0 <= i < dims[k] else None
        if pad == "border":
            return min(max(i, 0), dims[k] - 1)
        return int(reflect(i, lo[k], hi[k]))

    y = np.zeros(x.shape[:2] + grid.shape[1:-1])
    for b in range(x.shape[0]):
        for o in itertools.product(*[range(v) for v in grid.shape[1:-1]]):
            co = []
            for k in range(ns):
                g, d = grid[(b,) + o + (k,)], dims[k]
                v = (g + 1) / 2 * (d - 1) if align else ((g + 1) * d - 1) / 2
                if mode == "nearest":
                    v = np.rint(v)
                if not lo[k] <= v <= hi[k] and pad == "border":
                    v = min(max(v, 0), d - 1)
                elif not lo[k] <= v <= hi[k] and pad == "reflection":
                    v = reflect(v, lo[k], hi[k])
                co.append(v)
            per_axis = []
            for k, v in enumerate(co):
                if mode == "nearest":
                    per_axis.append([(int(v), 1.0)])
                    continue
                f = int(np.floor(v))
                w = keys_cubic(v - f) if mode == "cubic" else [1 - (v - f), v - f]
                first = f - 1 if mode == "cubic" else f
                per_axis.append([(first + i, w[i]) for i in range(len(w))])
            acc = np.zeros(x.shape[1])
            for combo in itertools.product(*per_axis):
                idx = [index(i, k) for k, (i, _) in enumerate(combo)]
                if None in idx:
                    continue
                acc += np.prod([w for _, w in combo]) * x[(b, slice(None)) + tuple(idx[::-1])]
            y[(b, slice(None)) + o] = acc
    return y


# ---- the cases ------------------------------------------------------------------

def cases():
    c = {}

    def conv(name, xs, ws, s, p, d, group, bias, **extra):
        attrs = dict(strides=s, dilations=d, group=group, kernel_shape=list(ws[2:]), **extra)
        if "auto_pad" not in extra:
            attrs["pads"] = p
        conv_case(c, name, "Conv", attrs, xs, ws, bias and ws[0],
                  lambda w: conv3_ref(w["X"], w["W"], w.get("B"), s, p, d, group))
    conv("Conv3d_stride_pads_bias", (2, 3, 5, 6, 5), (4, 3, 3, 3, 2), [2, 1, 2], [1, 0, 1, 0, 1, 1], [1, 1, 1], 1,
         True)
    conv("Conv3d_dilation_groups", (1, 4, 6, 5, 5), (6, 2, 2, 3, 2), [1, 2, 1], [0, 1, 1, 1, 0, 0], [2, 1, 2], 2,
         False)
    conv("Conv3d_depthwise", (2, 3, 4, 4, 4), (3, 1, 3, 1, 2), [2, 1, 1], [1, 0, 0, 1, 0, 1], [1, 1, 1], 3, True)
    # SAME_UPPER at stride 2: 5 keeps 3 (the 3-wide window 2 beyond: 1, 1), 6 keeps 3 (1 beyond: 0, 1)
    conv("Conv3d_auto_pad_same_upper", (1, 2, 5, 6, 5), (2, 2, 3, 3, 3), [2, 2, 2], [1, 0, 1, 1, 1, 1], [1, 1, 1], 1,
         True, auto_pad="SAME_UPPER")

    def convt(name, xs, ws, s, p, d, group, op, bias, shape=None):
        """shape: output_shape instead of pads (the pads and output padding it implies given to the reference)"""
        attrs = dict(strides=s, dilations=d, group=group, kernel_shape=list(ws[2:]))
        attrs.update(output_shape=shape) if shape else attrs.update(pads=p, output_padding=op)
        conv_case(c, name, "ConvTranspose", attrs, xs, ws, bias and ws[1] * group,
                  lambda w: convt3_ref(w["X"], w["W"], w.get("B"), s, p, d, group, op))
    convt("ConvT3d_stride_pads_outpad_bias", (2, 3, 3, 3, 2), (3, 2, 3, 2, 3), [2, 2, 1], [1, 0, 1, 0, 1, 0],
          [1, 1, 1], 1, [1, 1, 0], True)
    convt("ConvT3d_dilation_groups", (1, 4, 3, 3, 3), (4, 2, 2, 2, 2), [1, 2, 1], [0, 0, 0, 0, 0, 0], [2, 1, 2], 2,
          [0, 0, 0], False)
    convt("ConvT3d_depth_stride3_crop", (2, 2, 3, 2, 2), (2, 2, 4, 1, 2), [3, 1, 2], [2, 0, 0, 3, 0, 1], [1, 1, 1],
          1, [2, 0, 1], True)
    # output_shape 8 x 5 x 4: the natural 7 x 5 x 4 plus one at the end of the depth (pads 0, output padding 1)
    convt("ConvT3d_output_shape", (1, 2, 3, 2, 2), (2, 2, 3, 2, 1), [2, 3, 3], [0, 0, 0, 0, 0, 0], [1, 1, 1], 1,
          [1, 0, 0], False, [8, 5, 4])

    def pool(name, op, xs, k, s, p, d=(1, 1, 1), ceil=0, cip=0, lp=None):
        attrs = dict(kernel_shape=k, strides=s, pads=p, ceil_mode=ceil, dilations=list(d))
        if op == "AveragePool":
            attrs["count_include_pad"] = cip
        if lp:
            attrs["p"] = lp
        kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[op]
        c[name] = ([node(op, ["X"], ["Y"], **attrs)], {"X": r(*xs)},
                   lambda w: pool3_ref(w["X"], k, s, p, d, ceil, kind, cip, lp or 2))
    pool("MaxPool3d_pads_dilation_ceil", "MaxPool", (2, 2, 7, 6, 5), [3, 2, 2], [2, 2, 1], [1, 0, 1, 1, 1, 0],
         d=(1, 2, 1), ceil=1)
    pool("MaxPool3d_strided", "MaxPool", (1, 3, 5, 5, 6), [2, 3, 2], [2, 1, 2], [0, 1, 0, 0, 1, 0])
    pool("AveragePool3d_exclude_pad_ceil", "AveragePool", (2, 2, 6, 5, 7), [3, 2, 3], [2, 2, 2], [1, 1, 0, 1, 0, 1],
         ceil=1)
    pool("AveragePool3d_include_pad_dilation", "AveragePool", (1, 2, 6, 6, 5), [2, 3, 2], [2, 1, 2],
         [1, 1, 1, 1, 1, 0], d=(2, 1, 1), cip=1, ceil=1)
    pool("LpPool3d_p3_pads_ceil", "LpPool", (2, 2, 5, 6, 5), [2, 3, 2], [2, 2, 1], [1, 0, 1, 0, 1, 0], ceil=1, lp=3)
    pool("LpPool3d_p2_dilation", "LpPool", (1, 3, 6, 5, 5), [2, 2, 3], [1, 2, 1], [0, 0, 1, 0, 0, 1], d=(2, 1, 1))
    # GridSample cubic (2-D) and 3-D grids: the grid reaches past the image (1.3) so that taps fall outside it
    for mode, pad, align, xs, gs in (("cubic", "zeros", 0, (2, 2, 4, 5), (2, 3, 2, 2)),
                                     ("cubic", "reflection", 1, (1, 2, 5, 4), (1, 2, 3, 2)),
                                     ("cubic", "border", 0, (1, 3, 4, 4), (1, 3, 2, 2)),
                                     ("linear", "zeros", 0, (1, 2, 3, 4, 5), (1, 2, 3, 2, 3)),
                                     ("linear", "border", 1, (2, 1, 4, 3, 3), (2, 2, 2, 2, 3)),
                                     ("nearest", "reflection", 0, (1, 2, 3, 3, 4), (1, 2, 2, 3, 3)),
                                     ("cubic", "reflection", 0, (1, 1, 4, 4, 5), (1, 2, 1, 2, 3))):
        name = "GridSample%s_%s_%s_ac%d" % ("3d" if len(xs) == 5 else "", mode, pad, align)
        c[name] = ([node("GridSample", ["X", "G"], ["Y"], mode=mode, padding_mode=pad, align_corners=align)],
                   {"X": r(*xs), "G": np.clip(0.8 * r(*gs), -1.3, 1.3)},
                   (lambda mode, pad, align: lambda w: grid_sample_ref(w["X"], w["G"], mode, pad, align))(mode, pad,
                                                                                                            align))
    return c


# ---- float32 -----------------------------------------------------------------------

def run32(fsdpc, work, name, nodes, weights, y0):
    """the model in float32, one SGD step of lr 1: its loss and its gradient (w0 - w1)"""
    w32 = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    g = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("Y", TensorProto.FLOAT, list(y0.shape))],
                          [numpy_helper.from_array(v, k) for k, v in w32.items()])
    path = os.path.join(work, name + ".f32.onnx")
    opset = max([17] + [gradcheck.NEWER_OPS.get(n.op_type, 17) for n in nodes])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)
    t = os.path.join(work, name + ".t.npy")
    np.save(os.path.join(work, name + ".t32.npy"), np.load(t).astype(np.float32))
    exe = os.path.join(work, name + ".f32")
    run([fsdpc, path, "-o", exe, "--target", "cpu", "--loss", "mse:Y,T", "--optimizer", "sgd", "--verify"])
    run([exe, "--data", "T=" + os.path.join(work, name + ".t32.npy"), "--steps", "1", "--lr", "1", "--momentum", "0",
         "--weight-decay", "0", "--metrics", exe + ".jsonl", "--export-onnx", exe + ".out.onnx", "--quiet"])
    w1 = onnx_weights(exe + ".out.onnx")
    return read_metrics(exe + ".jsonl")[0][0], {k: w32[k].astype(np.float64) - w1[k] for k in w32}


def check32(fsdpc, work, name, spec):
    nodes, weights, fwd = spec
    y0 = fwd(weights)
    ref = float(np.mean((y0 - np.load(os.path.join(work, name + ".t.npy"))) ** 2))
    w64 = onnx_weights(os.path.join(work, name + ".out.onnx"))
    g64 = {k: weights[k] - w64[k] for k in weights}
    l32, g32 = run32(fsdpc, work, name, nodes, weights, y0)
    check(abs(l32 - ref) <= 1e-5 * max(1.0, abs(ref)), "%s float32: loss %.9g, NumPy %.9g" % (name, l32, ref))
    for k in weights:
        err, top = float(np.max(np.abs(g32[k] - g64[k]))), float(np.max(np.abs(g64[k])))
        check(err <= 1e-4 * max(top, 1e-3), "%s float32: gradient of %s off by %.3g (largest element %.3g)"
              % (name, k, err, top))
    print("ok %-36s float32 loss %.6f" % (name, l32))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    all_cases = cases()
    names = sys.argv[3:] or list(all_cases)
    for n in names:
        check(n in all_cases, "no case " + n)
        check_case(fsdpc, work, n, all_cases[n])
        check32(fsdpc, work, n, all_cases[n])
    print("OK gradcheck_3d: %d cases, float64 and float32" % len(names))


if __name__ == "__main__":
    main()
