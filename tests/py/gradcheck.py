"""Every gradient rule against central finite differences, in float64.

usage: gradcheck.py FSDPC WORKDIR [CASE...]

For each case a small float64 ONNX graph is built whose inputs of the op
under test are trainable initializers.  The compiled executable gives:
  - the loss at w0 (checked against a NumPy forward: forward correctness),
  - the gradient, as w0 - w1 after one SGD step with lr 1, no momentum/decay,
  - the loss at w0 +- h*d for random directions d (perturbed models: each
    written by fsdpc --init-only as an init file that the executable of w0
    reads with --init, no executable built for it).
The directional derivative g.d must match (L+ - L-) / 2h.

Where finite differences cannot tell (a kink: the convention of the gradient exactly at it), EXACT cases check the
gradient itself against NumPy's: Clip with inputs sitting exactly on its bounds passes no gradient there (PyTorch's
relu6 / hardtanh, and clamp from torch 2 on: the gradient passes where min < x < max; an absent bound is none).
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, onnx_weights, read_metrics, run

rng = np.random.default_rng(1)


def r(*shape, lo=None):
    a = rng.standard_normal(shape)
    if lo is not None:  # keep away from kinks / zeros
        a = np.sign(a) * (lo + np.abs(a))
    return a


def sig(x):
    return 1 / (1 + np.exp(-x))


def softmax_ce(z, labels):
    z = z - z.max(-1, keepdims=True)
    lse = np.log(np.exp(z).sum(-1))
    return np.mean(lse - np.take_along_axis(z, labels[..., None], -1)[..., 0])


def gemm_ref(ta, tb, alpha, beta):
    return lambda w, x: alpha * ((w["A"].T if ta else w["A"]) @ (w["B"].T if tb else w["B"])) + beta * w["C"]


# name: (nodes, weights, forward(w) -> Y, loss kind)
def cases():
    c = {}
    def ew(op, a, b, f):
        c[op + "_" + "x".join(map(str, b.shape))] = ([helper.make_node(op, ["A", "B"], ["Y"])], {"A": a, "B": b}, f)
    ew("Add", r(3, 4), r(4), lambda w: w["A"] + w["B"])
    ew("Sub", r(3, 4), r(3, 1), lambda w: w["A"] - w["B"])
    ew("Mul", r(2, 3, 4), r(3, 4), lambda w: w["A"] * w["B"])
    ew("Div", r(3, 4), 1.5 + np.abs(r(4)), lambda w: w["A"] / w["B"])
    for op, f in (("Relu", lambda a: np.maximum(a, 0)), ("Tanh", np.tanh), ("Sigmoid", sig)):
        c[op] = ([helper.make_node(op, ["A"], ["Y"])], {"A": r(3, 5, lo=0.1)}, (lambda f: lambda w: f(w["A"]))(f))
    pos = lambda *sh: 0.2 + np.abs(r(*sh))
    # x moved at least 0.1 away from the kinks k * period - shift(0) (piecewise functions)
    def off_kinks(x, period, shift=lambda a: a):
        d = np.mod(shift(x), period)
        return np.where(d < 0.1, x + 0.15, np.where(d > period - 0.1, x - 0.15, x))
    for op, x, f, attrs in (("Sqrt", pos(3, 4), np.sqrt, {}), ("Reciprocal", r(3, 4, lo=0.3), lambda a: 1 / a, {}),
                            ("Exp", r(3, 4), np.exp, {}), ("Log", pos(3, 4), np.log, {}),
                            ("Neg", r(3, 4), lambda a: -a, {}), ("Abs", r(3, 4, lo=0.1), np.abs, {}),
                            ("Erf", r(3, 4), np.vectorize(__import__("math").erf), {}),
                            ("LeakyRelu", r(3, 4, lo=0.1), lambda a: np.where(a > 0, a, 0.25 * a), {"alpha": 0.25}),
                            ("Softplus", r(3, 4), lambda a: np.log1p(np.exp(a)), {}),
                            ("Elu", r(3, 4, lo=0.1), lambda a: np.where(a > 0, a, 0.75 * np.expm1(a)), {"alpha": 0.75}),
                            ("Selu", r(3, 4, lo=0.1), lambda a: 1.05070102214813232421875 * np.where(  # ONNX defaults (float32)
                                a > 0, a, 1.67326319217681884765625 * np.expm1(a)), {}),
                            ("Celu", r(3, 4, lo=0.1), lambda a: np.where(a > 0, a, 1.5 * np.expm1(a / 1.5)),
                             {"alpha": 1.5}),
                            ("ThresholdedRelu", off_kinks(3 * r(3, 4), 10.0, lambda a: a - 0.5),
                             lambda a: np.where(a > 0.5, a, 0), {"alpha": 0.5}),
                            ("Softsign", r(3, 4), lambda a: a / (1 + np.abs(a)), {}),
                            ("Cos", r(3, 4), np.cos, {}), ("Sin", r(3, 4), np.sin, {}),
                            ("Floor", off_kinks(3 * r(3, 4), 1.0), np.floor, {}),
                            ("Sign", r(3, 4, lo=0.1), np.sign, {}),
                            ("HardSigmoid", off_kinks(4 * r(3, 4), 2.5, lambda a: a + 2.5),
                             lambda a: np.clip(0.2 * a + 0.5, 0, 1), {}),
                            ("HardSwish", off_kinks(5 * r(3, 4), 3.0, lambda a: a + 3),
                             lambda a: a * np.clip(a + 3, 0, 6) / 6, {}),
                            ("Gelu", 2 * r(3, 4), lambda a: 0.5 * a * (1 + np.vectorize(__import__("math").erf)(a / np.sqrt(2))), {})):
        c[op] = ([helper.make_node(op, ["A"], ["Y"], **attrs)], {"A": x}, (lambda f: lambda w: f(w["A"]))(f))
    c["Gelu_tanh"] = ([helper.make_node("Gelu", ["A"], ["Y"], approximate="tanh")], {"A": 2 * r(3, 4)},
                      lambda w: 0.5 * w["A"] * (1 + np.tanh(np.sqrt(2 / np.pi) * (w["A"] + 0.044715 * w["A"] ** 3))))
    # Min / Max: three inputs (a chain of two), broadcasting, no ties (finite differences need a smooth point)
    c["Max3"] = ([helper.make_node("Max", ["A", "B", "C"], ["Y"])], {"A": r(3, 4), "B": r(4), "C": r(3, 1)},
                 lambda w: np.maximum(np.maximum(w["A"], w["B"]), w["C"]))
    c["Min"] = ([helper.make_node("Min", ["A", "B"], ["Y"])], {"A": r(3, 4), "B": r(3, 4)},
                lambda w: np.minimum(w["A"], w["B"]))
    # Mod: a and b away from the jumps (a/b at least 0.1 from an integer)
    ma, mb = 3 * r(3, 4), 0.5 + np.abs(r(4))
    q = ma / mb
    ma = np.where(np.abs(q - np.round(q)) < 0.1, ma + 0.3 * mb, ma)
    for name, fm, f in (("Mod", 0, np.mod), ("Mod_fmod", 1, np.fmod)):
        c[name] = ([helper.make_node("Mod", ["A", "B"], ["Y"], fmod=fm)], {"A": ma, "B": mb * np.sign(r(4, lo=0.1))},
                   (lambda f: lambda w: f(w["A"], w["B"]))(f))
    lo = numpy_helper.from_array(np.array(-0.5), "lo")
    hi = numpy_helper.from_array(np.array(0.5), "hi")
    c["Clip"] = ([helper.make_node("Clip", ["A", "lo", "hi"], ["Y"])], {"A": r(3, 4), "lo": lo, "hi": hi},
                 lambda w: np.clip(w["A"], -0.5, 0.5))
    c["MatMul"] = ([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": r(3, 4), "B": r(4, 5)},
                   lambda w: w["A"] @ w["B"])
    c["MatMul_batched_shared"] = ([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": r(2, 3, 4), "B": r(4, 5)},
                                  lambda w: w["A"] @ w["B"])
    c["MatMul_batched"] = ([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": r(2, 3, 4), "B": r(2, 4, 5)},
                           lambda w: w["A"] @ w["B"])
    c["MatMul_bcast_A"] = ([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": r(3, 4), "B": r(2, 4, 5)},
                           lambda w: w["A"] @ w["B"])
    # partially broadcast batch dims: multi-query attention's one key head against every query head, each side,
    # and each operand broadcast on a dim of its own (codegen loops over the outer dims)
    for name, sa, sb in (("MatMul_partial_A", (2, 1, 3, 4), (2, 3, 4, 5)), ("MatMul_partial_B", (2, 3, 3, 4), (2, 1, 4, 5)),
                         ("MatMul_partial_cross", (3, 1, 2, 4), (1, 2, 4, 5)),
                         ("MatMul_partial_outer", (2, 1, 3, 2, 4), (2, 4, 1, 4, 5))):
        c[name] = ([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": r(*sa), "B": r(*sb)},
                   lambda w: w["A"] @ w["B"])
    for ta in (0, 1):
        for tb in (0, 1):
            for alpha, beta in ((1.0, 1.0), (0.75, 1.25)):  # exact in float32 (ONNX stores float attrs so)
                a = r(4, 3) if ta else r(3, 4)
                b = r(5, 4) if tb else r(4, 5)
                node = helper.make_node("Gemm", ["A", "B", "C"], ["Y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
                f = gemm_ref(ta, tb, alpha, beta)
                c["Gemm_t%d%d_a%g" % (ta, tb, alpha)] = ([node], {"A": a, "B": b, "C": r(5)},
                                                          (lambda f: lambda w: f(w, None))(f))
    shape = numpy_helper.from_array(np.array([2, -1], dtype=np.int64), "shape")
    c["Reshape"] = ([helper.make_node("Reshape", ["A", "shape"], ["R"]), helper.make_node("Mul", ["R", "K"], ["Y"])],
                    {"A": r(3, 4), "K": r(2, 6), "shape": shape}, lambda w: w["A"].reshape(2, 6) * w["K"])
    c["Transpose"] = ([helper.make_node("Transpose", ["A"], ["R"], perm=[2, 0, 1]),
                       helper.make_node("Mul", ["R", "K"], ["Y"])],
                      {"A": r(2, 3, 4), "K": r(4, 2, 3)}, lambda w: w["A"].transpose(2, 0, 1) * w["K"])
    c["Identity_tied"] = ([helper.make_node("Identity", ["A"], ["R"]), helper.make_node("Mul", ["R", "A"], ["Y"])],
                          {"A": r(3, 4)}, lambda w: w["A"] * w["A"])
    ce_labels = rng.integers(0, 5, size=(2, 3))
    c["CrossEntropy"] = ([helper.make_node("MatMul", ["A", "B"], ["Y"])], {"A": r(2, 3, 4), "B": r(4, 5)},
                         lambda w: w["A"] @ w["B"], ce_labels)
    return c


# ops that need a later opset than 17 (Resize: opset 18's axes, 19's modes; Attention: 25's windows)
NEWER_OPS = {"Gelu": 20, "Resize": 19, "Attention": 25, "RotaryEmbedding": 23, "ScatterND": 18, "ScatterElements": 18,
             "CumProd": 26, "Swish": 24, "GroupNormalization": 21, "CenterCropPad": 18, "AffineGrid": 20,
             "GridSample": 20, "SwiGLU": 28}


def build(path, nodes, weights, y_shape):
    inits = []
    for k, v in weights.items():
        inits.append(v if isinstance(v, TensorProto) else numpy_helper.from_array(np.asarray(v, np.float64), k))
    g = helper.make_graph(nodes, "g", [], [helper.make_tensor_value_info("Y", TensorProto.DOUBLE, y_shape)], inits)
    opset = max([17] + [NEWER_OPS.get(n.op_type, 17) for n in nodes])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]), path)


def compile_run(fsdpc, work, tag, nodes, weights, y_shape, loss, data, lr, exe=None, flags=()):
    """one step of the model's executable (built as work/tag, fsdpc given flags too), its loss and exported
    weights; given exe (built from the same nodes with other weights), work/tag.init alone is written
    (--init-only) and exe runs from it: its loss, no weights"""
    onnx_path = os.path.join(work, tag + ".onnx")
    build(onnx_path, nodes, weights, y_shape)
    out = os.path.join(work, tag)
    run([fsdpc, onnx_path, "-o", out, "--target", "cpu", "--loss", loss, "--optimizer", "sgd", "--verify"]
        + (["--init-only"] if exe else []) + list(flags))
    m = out + ".jsonl"
    run([exe or out, "--data", data, "--steps", "1", "--lr", str(lr), "--momentum", "0", "--weight-decay", "0",
         "--metrics", m, "--quiet"] + (["--init", out + ".init"] if exe else ["--export-onnx", out + ".out.onnx"]))
    losses, _ = read_metrics(m)
    return losses[0], None if exe else onnx_weights(out + ".out.onnx")


def check_case(fsdpc, work, name, spec):
    nodes, weights, fwd = spec[:3]
    labels = spec[3] if len(spec) > 3 else None
    w0 = {k: v for k, v in weights.items() if not isinstance(v, TensorProto)}
    y0 = fwd(w0)
    if labels is None:
        t = r(*y0.shape)
        np.save(os.path.join(work, name + ".t.npy"), t)
        loss, data, ref = "mse:Y,T", "T=" + os.path.join(work, name + ".t.npy"), np.mean((y0 - t) ** 2)
    else:
        np.save(os.path.join(work, name + ".t.npy"), labels.astype(np.int64))
        loss, data, ref = "cross_entropy:Y,T", "T=" + os.path.join(work, name + ".t.npy"), softmax_ce(y0, labels)
    l0, w1 = compile_run(fsdpc, work, name, nodes, weights, list(y0.shape), loss, data, 1.0)
    check(abs(l0 - ref) <= 1e-12 * max(1.0, abs(ref)), "%s: forward loss %.17g, NumPy %.17g" % (name, l0, ref))
    grads = {k: w0[k] - w1[k] for k in w0}
    h = 1e-6
    for trial in range(2):
        d = {k: rng.standard_normal(v.shape) for k, v in w0.items()}
        exe = os.path.join(work, name)
        lp, _ = compile_run(fsdpc, work, name + ".p", nodes, {**weights, **{k: w0[k] + h * d[k] for k in w0}},
                            list(y0.shape), loss, data, 0.0, exe)
        lm, _ = compile_run(fsdpc, work, name + ".m", nodes, {**weights, **{k: w0[k] - h * d[k] for k in w0}},
                            list(y0.shape), loss, data, 0.0, exe)
        fd = (lp - lm) / (2 * h)
        an = sum(float(np.sum(grads[k] * d[k])) for k in w0)
        check(abs(fd - an) <= 1e-6 * max(1.0, abs(an)), "%s: directional derivative %.12g, finite differences %.12g"
              % (name, an, fd))
    print("ok %-22s loss %.6f  |grad| %.4f" % (name, l0, np.sqrt(sum(float(np.sum(g * g)) for g in grads.values()))))


def on_bounds(lo, hi, shape):
    """random values with every fourth one exactly lo, hi, or (an absent bound) a value beyond the other"""
    a = 4 * r(*shape)
    a.flat[0::4] = lo if lo is not None else -7.0
    a.flat[1::4] = hi if hi is not None else 7.0
    return a


def exact_cases():
    """name: (nodes, weights, forward(w), d Y / d A as a mask of A)"""
    c = {}
    for tag, lo, hi in (("relu6", 0.0, 6.0), ("min_only", -0.5, None), ("max_only", None, 0.5)):
        ins = ["A", "lo" if lo is not None else "", "hi" if hi is not None else ""]
        w = {"A": on_bounds(lo, hi, (4, 6))}
        if lo is not None:
            w["lo"] = numpy_helper.from_array(np.array(lo), "lo")
        if hi is not None:
            w["hi"] = numpy_helper.from_array(np.array(hi), "hi")
        lo_, hi_ = -np.inf if lo is None else lo, np.inf if hi is None else hi
        c["Clip_bounds_" + tag] = ([helper.make_node("Clip", ins, ["Y"])], w,
                                   (lambda lo_, hi_: lambda w: np.clip(w["A"], lo_, hi_))(lo_, hi_),
                                   (lambda lo_, hi_: lambda w: (w["A"] > lo_) & (w["A"] < hi_))(lo_, hi_))
    return c


def check_exact(fsdpc, work, name, spec):
    """one SGD step (lr 1) of mse(Y, T): the gradient of A against NumPy's, exactly 0 where the mask is"""
    nodes, weights, fwd, mask = spec
    w0 = {k: v for k, v in weights.items() if not isinstance(v, TensorProto)}
    y0 = fwd(w0)
    t = r(*y0.shape)
    np.save(os.path.join(work, name + ".t.npy"), t)
    l0, w1 = compile_run(fsdpc, work, name, nodes, weights, list(y0.shape), "mse:Y,T",
                         "T=" + os.path.join(work, name + ".t.npy"), 1.0)
    check(abs(l0 - np.mean((y0 - t) ** 2)) <= 1e-12, "%s: forward loss %.17g" % (name, l0))
    g, want = w0["A"] - w1["A"], 2 * (y0 - t) / y0.size * mask(w0)
    bad = np.argwhere(np.abs(g - want) > 1e-12 * np.max(np.abs(want)))
    check(len(bad) == 0, "%s: gradient at A%s (= %r) is %.6g, NumPy's %.6g (%d elements differ)"
          % (name, list(bad[0]) if len(bad) else "", w0["A"][tuple(bad[0])] if len(bad) else 0,
             g[tuple(bad[0])] if len(bad) else 0, want[tuple(bad[0])] if len(bad) else 0, len(bad)))
    print("ok %-22s gradient = NumPy's, 0 on the bounds (%d of %d elements)" % (name, int(np.sum(~mask(w0))),
                                                                              w0["A"].size))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    all_cases, exact = cases(), exact_cases()
    names = sys.argv[3:] or list(all_cases) + list(exact)
    for n in names:
        check(n in all_cases or n in exact, "no case " + n)
        if n in exact:
            check_exact(fsdpc, work, n, exact[n])
        else:
            check_case(fsdpc, work, n, all_cases[n])
    print("OK gradcheck: %d cases" % len(names))


if __name__ == "__main__":
    main()
