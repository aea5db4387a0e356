"""Opsets 7 to 12: each op read as the version the model's opset gives it (run by opsets.py).

For each op whose version at opsets 7-12 differs from opset 13's (an attribute that became an input, Softmax's
2-D coercion, Resize-10, Upsample and Scatter read as Resize and ScatterElements, ...) and a set of ops that only widened since (types, negative axes, broadcasting,
optional inputs): a small model made with onnx.helper at an old opset runs through `fsdpc --eval` and gives
NumPy's answer, and so does the same model lifted to opset 13 by ONNX's version converter (an independent
reading of the old version).  A model of the changed ops with parameters trains at opsets 7 to 12 exactly as
its opset 13 lift; a CNN exported by PyTorch at opsets 9 to 12 trains exactly as its export at opset 13.
Refused in one line: BatchNormalization-7's spatial 0, Squeeze-11 with an axes input (opset 13's form), Upsample
at opset 10 (deprecated there).
"""
import os
import warnings

import numpy as np
import onnx
import onnx.version_converter
from onnx import helper, numpy_helper

from common import check, run

rng = np.random.default_rng(1)
N = helper.make_node
X = rng.standard_normal((2, 3, 4))
I64 = lambda *a: np.array(a, np.int64)


def mk(nodes, inputs, want, inits=(), opset=11):
    """a model of nodes at opset: inputs and outputs typed as the arrays given"""
    vi = lambda n, a: helper.make_tensor_value_info(n, onnx.mapping.NP_TYPE_TO_TENSOR_TYPE[a.dtype], list(a.shape))
    g = helper.make_graph(nodes, "g", [vi(n, a) for n, a in inputs.items()], [vi(n, a) for n, a in want.items()],
                          [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def lift(m):
    return onnx.version_converter.convert_version(m, 13)


class Ctx:
    def __init__(self, fsdpc, work, evaluate, refuse):
        self.fsdpc, self.work = fsdpc, work
        self.evaluate_, self.refuse_ = evaluate, refuse

    def expect(self, tag, m, inputs, want):
        got = self.evaluate_(self.fsdpc, self.work, tag, m, inputs, list(want))
        for (name, w), g in zip(want.items(), got):
            same = g.shape == w.shape and g.dtype == w.dtype and (
                np.allclose(g, w, rtol=1e-6, atol=1e-12) if w.dtype.kind == "f" else np.array_equal(g, w))
            check(same, "%s: %s is %s %s %s, expected %s %s %s" % (tag, name, g.dtype, g.shape, g.ravel()[:6], w.dtype,
                                                                 w.shape, w.ravel()[:6]))
        print("ok %-34s %d outputs" % (tag, len(want)))

    def both(self, tag, nodes, inputs, want, inits=(), opset=11, lifted=True):
        """the model at opset gives want (NumPy's), and so does its lift to opset 13"""
        m = mk(nodes, inputs, want, inits, opset)
        self.expect("%s%d" % (tag, opset), m, inputs, want)
        if lifted:
            self.expect("%s%d_lift13" % (tag, opset), lift(m), inputs, want)

    def refuse(self, tag, m, *needles):
        self.refuse_(self.fsdpc, self.work, tag, m, *needles)


# ---- NumPy's readings ------------------------------------------------------------------------------------------

def coerced(f, x, axis):
    """Softmax-1..12: f over x made 2-D at axis"""
    axis %= x.ndim
    s = x.reshape(int(np.prod(x.shape[:axis])), -1)
    return f(s).reshape(x.shape)


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def hardmax(s):
    return np.eye(s.shape[-1])[s.argmax(-1)]


def resize_asym(x, scales, linear):
    """Resize-10: output i of an axis reads input i / scale (nearest: its floor; linear: between the two)"""
    y = x
    for ax, sc in enumerate(scales):
        n = y.shape[ax]
        pos = np.arange(int(np.floor(n * sc))) / sc
        lo = np.minimum(np.floor(pos).astype(int), n - 1)
        if not linear:
            y = np.take(y, lo, axis=ax)
            continue
        hi, w = np.minimum(lo + 1, n - 1), pos - np.floor(pos)
        shape = [1] * y.ndim
        shape[ax] = -1
        y = np.take(y, lo, axis=ax) * (1 - w.reshape(shape)) + np.take(y, hi, axis=ax) * w.reshape(shape)
    return y


# ---- forward: the changed ops ------------------------------------------------------------------------------------

def softmaxes(c):
    for v in (7, 11, 12):
        nodes = [N("Softmax", ["x"], ["s1"]), N("Softmax", ["x"], ["s0"], axis=0),
                 N("LogSoftmax", ["x"], ["l2"], axis=2)]
        want = {"s1": coerced(softmax, X, 1), "s0": coerced(softmax, X, 0),
                "l2": coerced(lambda s: np.log(softmax(s)), X, 2)}
        if v >= 11:
            nodes.append(N("LogSoftmax", ["x"], ["ln"], axis=-2))
            want["ln"] = coerced(lambda s: np.log(softmax(s)), X, -2)
        c.both("softmax", nodes, {"x": X}, want, opset=v)
        # ONNX's converter (1.12 and 1.23) lifts Hardmax as it is, without the coercion: NumPy only
        c.both("hardmax", [N("Hardmax", ["x"], ["h1"]), N("Hardmax", ["x"], ["h0"], axis=0)], {"x": X},
               {"h1": coerced(hardmax, X, 1), "h0": coerced(hardmax, X, 0)}, opset=v, lifted=False)


def attributes(c):
    """the attributes that became inputs: Split, Squeeze, Unsqueeze, ReduceSum (13), Pad, Clip (11), Slice, TopK (10),
    Dropout (12), each in its old form at the opsets that have it"""
    x1 = X[:1]
    srt = -np.sort(-X, axis=-1)
    for v in (7, 9, 10, 11, 12):
        nodes = [N("Split", ["x"], ["sa", "sb"], axis=2, split=[1, 3]), N("Split", ["x"], ["e0", "e1", "e2"], axis=1),
                 N("Squeeze", ["x1"], ["q"], axes=[0]), N("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
                 N("ReduceSum", ["x"], ["r"], axes=[0, 2], keepdims=0),
                 N("Dropout", ["x"], ["d"], ratio=0.3) if v < 12 else N("Dropout", ["x", "ratio"], ["d"])]
        want = {"sa": X[:, :, :1], "sb": X[:, :, 1:], "e0": X[:, :1], "e1": X[:, 1:2], "e2": X[:, 2:], "q": x1[0],
                "u": np.expand_dims(X, (0, 3)), "r": X.sum((0, 2)), "d": X}
        inits = {"ratio": np.array(0.3)} if v >= 12 else {}
        if v >= 11:
            nodes += [N("Squeeze", ["x1"], ["qn"], axes=[-3]), N("Unsqueeze", ["x"], ["un"], axes=[-1]),
                      N("ReduceSum", ["x"], ["rn"], axes=[-1])]
            want.update(qn=x1[0], un=X[..., None], rn=X.sum(-1, keepdims=True))
        if v < 11:
            nodes += [N("Pad", ["x"], ["p"], pads=[0, 0, 1, 0, 0, 2], value=1.5),
                      N("Pad", ["x"], ["pr"], pads=[0, 1, 1, 0, 1, 1], mode="reflect"),
                      N("Clip", ["x"], ["c"], min=-0.5, max=0.5), N("Clip", ["x"], ["cm"], min=0.25)]
            want.update(p=np.pad(X, [(0, 0), (0, 0), (1, 2)], constant_values=1.5),
                        pr=np.pad(X, [(0, 0), (1, 1), (1, 1)], mode="reflect"), c=np.clip(X, -0.5, 0.5),
                        cm=np.maximum(X, 0.25))
        else:
            nodes += [N("Pad", ["x", "pads", "cv"], ["p"]), N("Clip", ["x", "lo", "hi"], ["c"])]
            inits.update(pads=I64(0, 0, 1, 0, 0, 2), cv=np.array(1.5), lo=np.array(-0.5), hi=np.array(0.5))
            want.update(p=np.pad(X, [(0, 0), (0, 0), (1, 2)], constant_values=1.5), c=np.clip(X, -0.5, 0.5))
        if v < 10:
            nodes += [N("Slice", ["x"], ["sl"], starts=[0, 1], ends=[1, 3], axes=[0, 2]),
                      N("Slice", ["x"], ["sn"], starts=[1, 0], ends=[2, 2]),
                      N("TopK", ["x"], ["tv", "ti"], k=2)]
            want.update(sl=X[0:1, :, 1:3], sn=X[1:2, 0:2], tv=srt[..., :2], ti=np.argsort(-X, -1)[..., :2])
        else:
            nodes += [N("Slice", ["x", "st", "en", "ax", "sp"], ["sl"]), N("TopK", ["x", "k"], ["tv", "ti"], axis=1)]
            inits.update(st=I64(3), en=I64(0), ax=I64(2), sp=I64(-1), k=I64(2))
            want.update(sl=X[:, :, 3:0:-1], tv=-np.sort(-X, axis=1)[:, :2], ti=np.argsort(-X, 1)[:, :2])
        c.both("attrs", nodes, {"x": X, "x1": x1}, want, inits, opset=v)


def resize_bn_gemm(c):
    im = rng.standard_normal((1, 2, 3, 4))
    sc, sl = np.array([1, 1, 2, 3], np.float32), np.array([1, 1, 2, 2], np.float32)
    # Resize-10 (X, scales): asymmetric, nearest = floor (onnx 1.12's converter lifts it otherwise: NumPy only)
    c.both("resize", [N("Resize", ["im", "sc"], ["n"]), N("Resize", ["im", "sl"], ["l"], mode="linear")],
           {"im": im}, {"n": resize_asym(im, sc, 0), "l": resize_asym(im, sl, 1)}, {"sc": sc, "sl": sl}, 10,
           lifted=False)
    # Upsample: the same Resize (its scales an attribute at opsets 7 and 8, an input at 9)
    c.both("upsample", [N("Upsample", ["im"], ["n"], scales=[1.0, 1.0, 2.0, 3.0]),
                        N("Upsample", ["im"], ["l"], scales=[1.0, 1.0, 2.0, 2.0], mode="linear")],
           {"im": im}, {"n": resize_asym(im, sc, 0), "l": resize_asym(im, sl, 1)}, opset=7, lifted=False)
    c.both("upsample", [N("Upsample", ["im", "sc"], ["n"]), N("Upsample", ["im", "sl"], ["l"], mode="linear")],
           {"im": im}, {"n": resize_asym(im, sc, 0), "l": resize_asym(im, sl, 1)}, {"sc": sc, "sl": sl}, 9,
           lifted=False)
    s, b, mu, var = (rng.standard_normal(2), rng.standard_normal(2), rng.standard_normal(2), rng.random(2) + .5)
    bn = lambda: (im - mu[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * s[:, None, None] + b[:, None, None]
    for v, attrs in ((7, {"spatial": 1}), (9, {})):
        c.both("bn", [N("BatchNormalization", ["im", "s", "b", "mu", "var"], ["y"], **attrs)], {"im": im},
               {"y": bn()}, {"s": s, "b": b, "mu": mu, "var": var}, v)
    a, w, cc = rng.standard_normal((2, 3)), rng.standard_normal((3, 4)), rng.standard_normal(4)
    c.both("gemm", [N("Gemm", ["a", "w", "c"], ["y"], alpha=0.5, beta=2.0)], {"a": a},
           {"y": 0.5 * a @ w + 2 * cc}, {"w": w, "c": cc}, 7)
    c.both("gemm", [N("Gemm", ["a", "wt"], ["y"], transB=1)], {"a": a}, {"y": a @ w}, {"wt": np.ascontiguousarray(w.T)},
           11)


def pools_args(c):
    im = rng.standard_normal((1, 2, 5, 5))
    mp = lambda s, k, st: np.stack([[[[im[0, ch, i * st:i * st + k, j * st:j * st + k].max() for j in range(s)]
                                      for i in range(s)] for ch in range(2)]])
    dil = np.maximum(np.maximum(im[:, :, 0:3, 0:3], im[:, :, 2:5, 0:3]), np.maximum(im[:, :, 0:3, 2:5], im[:, :, 2:5, 2:5]))
    c.both("maxpool", [N("MaxPool", ["im"], ["ceil"], kernel_shape=[2, 2], strides=[2, 2], ceil_mode=1),
                       N("MaxPool", ["im"], ["dil"], kernel_shape=[2, 2], dilations=[2, 2])],
           {"im": im}, {"ceil": mp(3, 2, 2), "dil": dil}, opset=10)
    c.both("maxpool", [N("MaxPool", ["im"], ["y"], kernel_shape=[3, 3], strides=[2, 2])], {"im": im},
           {"y": mp(2, 3, 2)}, opset=8)
    avg = im[:, :, :4, :4].reshape(1, 2, 2, 2, 2, 2).mean((3, 5))
    c.both("avgpool", [N("AveragePool", ["im"], ["y"], kernel_shape=[2, 2], strides=[2, 2])], {"im": im[:, :, :4, :4]},
           {"y": avg}, opset=7)
    d, i, u = rng.standard_normal((2, 4)), I64([1, 3], [0, 2]), rng.standard_normal((2, 2))
    want = d.copy()
    want[0, [1, 3]], want[1, [0, 2]] = u[0], u[1]
    for v in (9, 10):  # Scatter: ScatterElements' name before opset 11
        c.both("scatter", [N("Scatter", ["d", "i", "u"], ["y"], axis=1)], {"d": d}, {"y": want}, {"i": i, "u": u}, v)
    t = np.array([[1.0, 3.0, 3.0], [2.0, 2.0, 0.0]])
    c.both("argmax", [N("ArgMax", ["t"], ["a"], axis=-1, keepdims=0), N("ArgMin", ["t"], ["b"], axis=0)], {"t": t},
           {"a": I64(1, 0), "b": I64([0, 1, 1])}, opset=11)
    c.both("argmax", [N("ArgMax", ["t"], ["a"], axis=1, keepdims=0, select_last_index=1)], {"t": t},
           {"a": I64(2, 1)}, opset=12)


def widened(c):
    """ops whose later versions only widened (types, negative axes, broadcasting): one reading"""
    y4 = rng.standard_normal(4)
    for v in (7, 8, 9, 10, 11):
        nodes = [N("Flatten", ["x"], ["f"], axis=2), N("Concat", ["x", "x"], ["cat"], axis=1),
                 N("Tile", ["x", "rep"], ["t"]), N("Shape", ["x"], ["sh"]), N("Size", ["x"], ["sz"]),
                 N("Less", ["x", "zero"], ["lt"]), N("Greater", ["x", "zero"], ["gt"]), N("Transpose", ["x"], ["tr"], perm=[2, 0, 1]),
                 N("Reshape", ["x", "rs"], ["re"]), N("Constant", [], ["k"], value=numpy_helper.from_array(y4)),
                 N("Add", ["x", "k"], ["ad"]), N("Relu", ["x"], ["rl"]), N("Abs", ["x"], ["ab"])]
        inits = {"rep": I64(1, 2, 1), "zero": np.zeros(1), "rs": I64(4, 6)}
        want = {"f": X.reshape(6, 4), "cat": np.concatenate([X, X], 1), "t": np.tile(X, (1, 2, 1)), "sh": I64(2, 3, 4),
                "sz": np.array(24, np.int64), "lt": X < 0, "gt": X > 0, "tr": X.transpose(2, 0, 1), "re": X.reshape(4, 6),
                "ad": X + y4, "rl": np.maximum(X, 0), "ab": np.abs(X)}
        if v >= 8:
            nodes += [N("Expand", ["y4", "eshape"], ["ex"]), N("Max", ["x", "y4"], ["mx"]), N("Min", ["x", "y4"], ["mn"]),
                      N("Sum", ["x", "y4", "x"], ["su"]), N("Mean", ["x", "y4"], ["me"])]
            inits.update(y4=y4, eshape=I64(3, 4))
            want.update(ex=np.broadcast_to(y4, (3, 4)), mx=np.maximum(X, y4), mn=np.minimum(X, y4), su=2 * X + y4,
                        me=(X + y4) / 2)
        if v >= 9:
            nodes += [N("Where", ["lt", "x", "zero"], ["wh"]), N("Cast", ["lt"], ["cs"], to=onnx.TensorProto.DOUBLE),
                      N("ConstantOfShape", ["cshape"], ["co"], value=numpy_helper.from_array(np.array([2.5]))),
                      N("Sign", ["x"], ["sg"]), N("Erf", ["zero"], ["er"])]
            inits.update(cshape=I64(2, 2))
            want.update(wh=np.where(X < 0, X, 0), cs=(X < 0).astype(np.float64), co=np.full((2, 2), 2.5),
                        sg=np.sign(X), er=np.zeros(1))
        if v >= 10:
            nodes.append(N("Mod", ["x", "m"], ["md"], fmod=1))
            inits["m"] = np.array(0.7)
            want["md"] = np.fmod(X, 0.7)
        if v >= 11:
            nodes += [N("Gather", ["x", "gi"], ["ga"], axis=-1), N("Range", ["r0", "r1", "r2"], ["rg"]),
                      N("Equal", ["x", "x"], ["eq"]), N("Flatten", ["x"], ["fn"], axis=-1)]
            inits.update(gi=I64(-1, 0), r0=np.array(1.0), r1=np.array(4.0), r2=np.array(1.5))
            want.update(ga=X[..., [-1, 0]], rg=np.array([1.0, 2.5]), eq=np.ones_like(X, bool), fn=X.reshape(6, 4))
        c.both("widened", nodes, {"x": X}, want, inits, opset=v)


# ---- refusals -------------------------------------------------------------------------------------------------------

def refusals(c):
    im = rng.standard_normal((1, 2, 3, 3))
    v2 = np.ones(2)
    m = mk([N("BatchNormalization", ["im", "s", "s", "s", "s"], ["y"], spatial=0, name="bn")], {"im": im}, {"y": im},
           {"s": v2}, opset=7)
    c.refuse("bn7_spatial0", m, "'bn' (BatchNormalization)", "spatial", "opset 7", "convert_version(model, 13)")
    x1 = X[:1]
    m = mk([N("Squeeze", ["x1", "ax"], ["q"], name="sq")], {"x1": x1}, {"q": x1[0]}, {"ax": I64(0)}, opset=11)
    c.refuse("squeeze11_input", m, "'sq' (Squeeze)", "axes", "attribute before opset 13", "opset 11")
    m = mk([N("Upsample", ["x", "sc"], ["y"], name="up")], {"x": X}, {"y": X}, {"sc": np.ones(3, np.float32)}, 10)
    c.refuse("upsample10", m, "'up' (Upsample)", "deprecated from opset 10", "Resize")


# ---- training -------------------------------------------------------------------------------------------------------

def losses(c, tag, m, data, loss, dims=(), steps=3):
    d = os.path.join(c.work, tag)
    os.makedirs(d, exist_ok=True)
    path, exe = os.path.join(d, "model.onnx"), os.path.join(d, "run")
    onnx.save(m, path)
    run([c.fsdpc, path, "-o", exe, "--target", "cpu", "--loss", loss] + [a for k in dims for a in ("--dim", k)])
    args = [exe, "--steps", str(steps)]
    for k, v in data.items():
        np.save(os.path.join(d, k + ".npy"), v)
        args += ["--data", "%s=%s" % (k, os.path.join(d, k + ".npy"))]
    p = run(args)
    got = [l.split()[3] for l in p.stdout.splitlines() if l.startswith("step ")]
    check(len(got) == steps, "%s: %d loss lines in\n%s" % (tag, len(got), p.stdout))
    return got


def old_net(v):
    """Gemm, Clip, Unsqueeze, Pad, Squeeze, Slice, Split, Dropout, Softmax (2-D at axis 1 of [4, 1, 5]: the 5
    values, where opset 13's would normalise over the axis of 1), ReduceSum, TopK, Concat: each in opset v's form"""
    w, b = rng.standard_normal((6, 8)), rng.standard_normal(8)
    nodes, inits = [N("Gemm", ["x", "w", "b"], ["h"])], {"w": w, "b": b}
    if v < 11:
        nodes += [N("Clip", ["h"], ["c"], min=-1.0, max=1.5), N("Unsqueeze", ["c"], ["u"], axes=[1]),
                  N("Pad", ["u"], ["p"], pads=[0, 0, 1, 0, 0, 1], value=0.5)]
    else:
        nodes += [N("Clip", ["h", "lo", "hi"], ["c"]), N("Unsqueeze", ["c"], ["u"], axes=[1]),
                  N("Pad", ["u", "pads", "cv"], ["p"])]
        inits.update(lo=np.array(-1.0), hi=np.array(1.5), pads=I64(0, 0, 1, 0, 0, 1), cv=np.array(0.5))
    nodes.append(N("Squeeze", ["p"], ["sq"], axes=[1]))
    if v < 10:
        nodes.append(N("Slice", ["sq"], ["sl"], starts=[1], ends=[9], axes=[1]))
    else:
        nodes.append(N("Slice", ["sq", "st", "en", "ax"], ["sl"]))
        inits.update(st=I64(1), en=I64(9), ax=I64(1))
    nodes += [N("Split", ["sl"], ["s1", "s2"], axis=1, split=[3, 5]),
              N("Dropout", ["s2"], ["d"], ratio=0.25, name="drop") if v < 12 else
              N("Dropout", ["s2", "ratio"], ["d"], name="drop"),
              N("Unsqueeze", ["d"], ["d3"], axes=[1]), N("Softmax", ["d3"], ["sm"], axis=1),
              N("ReduceSum", ["sm"], ["r"], axes=[1], keepdims=0),
              N("TopK", ["r"], ["tv", "ti"], k=2) if v < 10 else N("TopK", ["r", "k"], ["tv", "ti"]),
              N("Concat", ["s1", "tv"], ["y"], axis=1)]
    inits.update(ratio=np.array(0.25), k=I64(2))
    used = {i for n in nodes for i in n.input}
    return mk(nodes, {"x": np.zeros((4, 6))}, {"y": np.zeros((4, 5))}, {k: a for k, a in inits.items() if k in used}, v)


def training(c):
    data = {"x": rng.standard_normal((8, 6)), "target": rng.standard_normal((8, 5))}
    for v in (7, 9, 10, 11, 12):
        m = old_net(v)
        old = losses(c, "train%d" % v, m, data, "mse:y,target")
        new = losses(c, "train%d_lift13" % v, lift(m), data, "mse:y,target")
        check(old == new, "the opset %d net trains %s; its opset 13 lift %s" % (v, old, new))
        print("ok train%-28d = its opset 13 lift: %s" % (v, " ".join(old)))


def export_cnn(path, opset):
    """a small CNN (Conv, ReLU6 as Clip, MaxPool, Pad, Slice, chunk as Split, sum as ReduceSum, Flatten, Linear,
    LogSoftmax) exported by PyTorch at opset, training mode, weights as seeded"""
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
            self.fc = torch.nn.Linear(4 * 3 * 4 + 6, 5)

        def forward(self, x):
            h = F.max_pool2d(F.relu6(self.conv(x)), 2)           # [B, 4, 4, 4]
            h = F.pad(h, (1, 0, 0, 0))[:, :, 1:, :4]             # [B, 4, 3, 4]
            a, b = h.chunk(2, dim=1)                              # [B, 2, 3, 4] each
            s = b.sum(dim=3).flatten(1)                           # [B, 6]
            z = torch.cat([a.flatten(1), b.flatten(1), s], 1)
            return F.log_softmax(self.fc(z), dim=1)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net().double(), (torch.zeros(2, 3, 8, 8, dtype=torch.float64),), path, opset_version=opset,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})


def cnn(c):
    data = {"x": rng.standard_normal((4, 3, 8, 8)), "target": rng.standard_normal((4, 5))}
    got = {}
    for v in (13, 9, 10, 11, 12):
        path = os.path.join(c.work, "cnn%d.onnx" % v)
        export_cnn(path, v)
        got[v] = losses(c, "cnn%d" % v, onnx.load(path), data, "mse:y,target", ["batch=2"])
        check(got[v] == got[13], "the CNN exported at opset %d trains %s; at opset 13 %s" % (v, got[v], got[13]))
    print("ok the CNN exported at opsets 9-12 = at 13:", " ".join(got[13]))


def main(fsdpc, work, evaluate, refuse):
    c = Ctx(fsdpc, os.path.join(work, "old"), evaluate, refuse)
    os.makedirs(c.work, exist_ok=True)
    softmaxes(c)
    attributes(c)
    resize_bn_gemm(c)
    pools_args(c)
    widened(c)
    refusals(c)
    training(c)
    cnn(c)
