"""Model-local functions inlined, and sequences of static length resolved, by the frontend and fold.

usage: functions.py FSDPC WORKDIR

Small float64 models made with onnx.helper (Debian's onnx 1.12), compiled and
compared with NumPy:
  - functions: a function (domain "lib") whose LeakyRelu takes its alpha from
    the caller (ref_attr_name), or from the function's default
    (FunctionProto.attribute_proto, field 11, which onnx 1.12's proto lacks:
    written here as raw bytes); a function calling it (nested, with an
    internal value named as a graph value, which must not clash); called
    twice. --eval against NumPy, then one SGD step: the loss against NumPy
    (1e-12) and the gradient against central finite differences along random
    directions (1e-6);
  - sequences: SplitToSequence (split a list, a scalar, absent with
    keepdims 0), SequenceAt, SequenceConstruct, SequenceInsert, SequenceErase,
    SequenceEmpty, SequenceLength, ConcatFromSequence (new_axis), Identity of a
    sequence: --eval against NumPy and the same gradient check;
  - opset 23's RMSNormalization: the committed models and onnx.reference
    outputs of gen_opset23.py (tests/data/opset23), and the gradient check.
Refused with one line naming the node and function or op (exit 1): a recursive
function (through another), a body node reading a value nothing defines, a
call with more inputs than the function has; a sequence position that is not
a constant or out of range, a tensor op reading a sequence, a sequence graph
output, a split input that is not a constant.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, read_metrics, onnx_weights, run

rng = np.random.default_rng(1)
r = lambda *s: rng.standard_normal(s)


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def with_defaults(fn, attrs):
    """fn with FunctionProto.attribute_proto (field 11) appended as raw bytes (onnx 1.12 lacks the field)"""
    raw = fn.SerializeToString()
    for a in attrs:
        b = a.SerializeToString()
        raw += varint(11 << 3 | 2) + varint(len(b)) + b
    f = onnx.FunctionProto()
    f.ParseFromString(raw)
    return f


def make(nodes, inputs, inits, functions=(), opset=18, outputs=("Y",)):
    vi = lambda n, a: helper.make_tensor_value_info(n, TensorProto.DOUBLE, list(a.shape))
    g = helper.make_graph(nodes, "g", [vi(n, a) for n, a in inputs.items()],
                          [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in outputs],
                          [v if isinstance(v, TensorProto) else numpy_helper.from_array(np.asarray(v), k)
                           for k, v in inits.items()])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("lib", 1)])
    m.functions.extend(functions)
    return m


def save(work, tag, m):
    d = os.path.join(work, tag)
    os.makedirs(d, exist_ok=True)
    p = os.path.join(d, "model.onnx")
    with open(p, "wb") as f:
        f.write(m.SerializeToString())
    return d, p


def evaluate(fsdpc, work, tag, m, inputs, outputs=("Y",)):
    d, p = save(work, tag, m)
    run([fsdpc, p, "-o", os.path.join(d, "run"), "--target", "cpu", "--eval", "--verify"])
    args = [os.path.join(d, "run"), "--out-dir", os.path.join(d, "out"), "--quiet"]
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v)
        args += ["--input", "%s=%s" % (k, os.path.join(d, k + ".npy"))]
    run(args)
    return [np.load(os.path.join(d, "out", o + ".npy")) for o in outputs]


def train_step(fsdpc, work, tag, make_model, weights, target, lr):
    """loss at weights and the weights after one SGD step of lr (float64, --loss mse:Y,T)"""
    d, p = save(work, tag, make_model(weights))
    exe = os.path.join(d, "run")
    run([fsdpc, p, "-o", exe, "--target", "cpu", "--loss", "mse:Y,T", "--optimizer", "sgd", "--verify"])
    np.save(os.path.join(d, "T.npy"), target)
    run([exe, "--data", "T=" + os.path.join(d, "T.npy"), "--steps", "1", "--lr", str(lr), "--momentum", "0",
         "--weight-decay", "0", "--metrics", os.path.join(d, "m.jsonl"), "--export-onnx",
         os.path.join(d, "out.onnx"), "--quiet"])
    return read_metrics(os.path.join(d, "m.jsonl"))[0][0], onnx_weights(os.path.join(d, "out.onnx"))


def gradcheck(fsdpc, work, tag, make_model, w0, fwd):
    """one SGD step with lr 1: loss vs NumPy, gradient vs central differences"""
    y0 = fwd(w0)
    t = r(*y0.shape)
    ref = np.mean((y0 - t) ** 2)
    l0, w1 = train_step(fsdpc, work, tag, make_model, w0, t, 1.0)
    check(abs(l0 - ref) <= 1e-12 * max(1.0, abs(ref)), "%s: loss %.17g, NumPy %.17g" % (tag, l0, ref))
    grads = {k: w0[k] - w1[k] for k in w0}
    h = 1e-6
    for trial in range(2):
        dd = {k: rng.standard_normal(v.shape) for k, v in w0.items()}
        lp, _ = train_step(fsdpc, work, tag + ".p", make_model, {k: w0[k] + h * dd[k] for k in w0}, t, 0.0)
        lm, _ = train_step(fsdpc, work, tag + ".m", make_model, {k: w0[k] - h * dd[k] for k in w0}, t, 0.0)
        fd = (lp - lm) / (2 * h)
        an = sum(float(np.sum(grads[k] * dd[k])) for k in w0)
        check(abs(fd - an) <= 1e-6 * max(1.0, abs(an)),
              "%s: directional derivative %.12g, finite differences %.12g" % (tag, an, fd))
    print("ok %-28s loss %.6f, gradient = finite differences" % (tag, l0))


def refused(fsdpc, work, tag, m, *want):
    d, p = save(work, tag, m)
    q = run([fsdpc, p, "-o", os.path.join(d, "run"), "--target", "cpu", "--eval"], check=False)
    lines = q.stderr.strip().splitlines()
    check(q.returncode == 1 and len(lines) == 1 and all(w in lines[0] for w in want),
          "%s: expected one error line with %s, got exit %d: %s" % (tag, want, q.returncode, q.stderr[-600:]))
    print("ok %-28s %s" % (tag, lines[0][-110:]))


# ---- functions -------------------------------------------------------------------------------------

def lin_act():
    """lib.LinAct(X, W, B) = LeakyRelu(X W + B, alpha = the caller's alpha, default 0.2)"""
    body = [helper.make_node("MatMul", ["X", "W"], ["t"]), helper.make_node("Add", ["t", "B"], ["u"])]
    lr = helper.make_node("LeakyRelu", ["u"], ["Z"])
    a = lr.attribute.add()
    a.name, a.ref_attr_name, a.type = "alpha", "alpha", onnx.AttributeProto.FLOAT
    fn = helper.make_function("lib", "LinAct", ["X", "W", "B"], ["Z"], body + [lr],
                              [helper.make_opsetid("", 18)], ["alpha"])
    return with_defaults(fn, [helper.make_attribute("alpha", 0.2)])


def block():
    """lib.Block(X, W1, B1, W2, B2) = LinAct(LinAct(X, W1, B1; alpha), W2, B2) * 0.5 + X; its internal
    value "h" has the name of a graph value"""
    c1 = helper.make_node("LinAct", ["X", "W1", "B1"], ["h"], domain="lib")
    a = c1.attribute.add()
    a.name, a.ref_attr_name, a.type = "alpha", "slope", onnx.AttributeProto.FLOAT
    body = [c1, helper.make_node("LinAct", ["h", "W2", "B2"], ["g"], domain="lib"),
            helper.make_node("Constant", [], ["half"], value=numpy_helper.from_array(np.array(0.5), "half")),
            helper.make_node("Mul", ["g", "half"], ["s"]), helper.make_node("Add", ["s", "X"], ["Z"])]
    return helper.make_function("lib", "Block", ["X", "W1", "B1", "W2", "B2"], ["Z"], body,
                                [helper.make_opsetid("", 18), helper.make_opsetid("lib", 1)], ["slope"])


def leaky(x, a):
    return np.where(x > 0, x, float(str(np.float32(a))) * x)  # a float attribute: its float32's shortest decimal


def block_ref(x, w1, b1, w2, b2, slope):
    h = leaky(x @ w1 + b1, slope if slope is not None else 0.2)
    return leaky(h @ w2 + b2, 0.2) * 0.5 + x


def functions(fsdpc, work):
    x = r(3, 4)
    w = {"W1": r(4, 4), "B1": r(4), "W2": r(4, 4), "B2": r(4), "V1": r(4, 4), "C1": r(4), "V2": r(4, 4), "C2": r(4)}

    def model(w, inputs):
        n1 = helper.make_node("Block", ["X", "W1", "B1", "W2", "B2"], ["h"], domain="lib", name="b1", slope=0.05)
        n2 = helper.make_node("Block", ["h", "V1", "C1", "V2", "C2"], ["Y"], domain="lib", name="b2")
        return make([n1, n2], inputs, w, [lin_act(), block()])

    def fwd(w, x=x):
        return block_ref(block_ref(x, w["W1"], w["B1"], w["W2"], w["B2"], 0.05), w["V1"], w["C1"], w["V2"], w["C2"], None)

    (y,) = evaluate(fsdpc, work, "fn_eval", model(w, {"X": x}), {"X": x})
    check(np.allclose(y, fwd(w), rtol=1e-12, atol=1e-12), "fn_eval: %s, expected %s" % (y.ravel()[:4], fwd(w).ravel()[:4]))
    print("ok %-28s nested, ref_attr_name, default, twice" % "fn_eval")
    xw = {**w, "X": x}
    gradcheck(fsdpc, work, "fn_train", lambda v: model(v, {}), xw, lambda v: fwd(v, v["X"]))

    # refusals
    f1 = helper.make_function("lib", "Ping", ["X"], ["Z"], [helper.make_node("Pong", ["X"], ["Z"], domain="lib")],
                              [helper.make_opsetid("", 18)])
    f2 = helper.make_function("lib", "Pong", ["X"], ["Z"], [helper.make_node("Ping", ["X"], ["Z"], domain="lib")],
                              [helper.make_opsetid("", 18)])
    refused(fsdpc, work, "fn_recursive",
            make([helper.make_node("Ping", ["X"], ["Y"], domain="lib", name="call")], {"X": x}, {}, [f1, f2]),
            "recursive", "function 'Ping' [domain lib]", "call/")
    f3 = helper.make_function("lib", "Bad", ["X"], ["Z"], [helper.make_node("Add", ["X", "nowhere"], ["Z"])],
                              [helper.make_opsetid("", 18)])
    refused(fsdpc, work, "fn_undefined",
            make([helper.make_node("Bad", ["X"], ["Y"], domain="lib", name="c")], {"X": x}, {}, [f3]),
            "node 'c/Add_0' (Add)", "'nowhere'", "function 'Bad'")
    refused(fsdpc, work, "fn_arity",
            make([helper.make_node("Bad", ["X", "X"], ["Y"], domain="lib", name="c")], {"X": x}, {}, [f3]),
            "node 'c' (Bad)", "takes 1 and 1")


# ---- sequences -------------------------------------------------------------------------------------

def I64(name, v):
    return numpy_helper.from_array(np.array(v, dtype=np.int64), name)


def seq_nodes():
    n = helper.make_node
    return [n("SplitToSequence", ["W", "sp"], ["S1"], axis=1),            # [4,1] [4,2] [4,3]
            n("SplitToSequence", ["W"], ["S2"], axis=0, keepdims=0),      # 4 x [6]
            n("SequenceAt", ["S1", "m1"], ["a"]), n("SequenceAt", ["S1", "zero"], ["b"]),
            n("SequenceAt", ["S1", "one"], ["c"]),
            n("SequenceConstruct", ["c", "b"], ["S3"]), n("SequenceInsert", ["S3", "a"], ["S4"]),  # c b a
            n("SequenceErase", ["S4", "m2"], ["S5"]),                     # c a
            n("ConcatFromSequence", ["S5"], ["Y1"], axis=1),              # [4,5]
            n("Identity", ["S2"], ["S2b"]),
            n("ConcatFromSequence", ["S2b"], ["Y2"], axis=-1, new_axis=1),  # [6,4] = W^T
            n("SequenceLength", ["S2"], ["len"]), n("Cast", ["len"], ["lenf"], to=TensorProto.DOUBLE),
            n("Mul", ["Y2", "lenf"], ["Y3"]), n("Transpose", ["Y3"], ["Y3t"]),
            n("SplitToSequence", ["W", "four"], ["S6"], axis=1),          # [4,4] [4,2]
            n("SequenceEmpty", [], ["E"]), n("SequenceInsert", ["E", "W"], ["E1"]),
            n("SequenceAt", ["S6", "one"], ["Y4"]), n("SequenceAt", ["E1", "zero"], ["Y5"]),
            n("Concat", ["Y1", "Y3t", "Y4", "Y5"], ["C"], axis=1), n("Tanh", ["C"], ["Y"])]


SEQ_CONSTS = {"sp": I64("sp", [1, 2, 3]), "m1": I64("m1", -1), "zero": I64("zero", 0), "one": I64("one", 1),
              "m2": I64("m2", -2), "four": I64("four", 4)}


def seq_ref(w):
    W = w["W"]
    return np.tanh(np.concatenate([W[:, 1:3], W[:, 3:], W * 4, W[:, 4:], W], 1))


def sequences(fsdpc, work):
    w = {"W": r(4, 6)}
    model = lambda v: make(seq_nodes(), {}, {**v, **SEQ_CONSTS})
    (y,) = evaluate(fsdpc, work, "seq_eval", model(w), {})
    check(y.shape == (4, 19) and np.allclose(y, seq_ref(w), rtol=1e-12, atol=1e-12),
          "seq_eval: %s %s, expected %s" % (y.shape, y.ravel()[:4], seq_ref(w).ravel()[:4]))
    print("ok %-28s SplitToSequence (list, scalar, none + keepdims 0), At, Construct, Insert, Erase, "
          "Length, Concat (new_axis), Empty, Identity" % "seq_eval")
    gradcheck(fsdpc, work, "seq_train", model, w, seq_ref)
    n = helper.make_node
    x = {"X": r(4, 6)}
    p = helper.make_tensor_value_info("p", TensorProto.INT64, [])
    m = make([n("SplitToSequence", ["X"], ["S"], axis=0), n("SequenceAt", ["S", "p"], ["Y"], name="at")], x, {})
    m.graph.input.append(p)
    refused(fsdpc, work, "seq_position_input", m, "node 'at' (SequenceAt)", "position 'p' must be a constant")
    m = make([n("SplitToSequence", ["X"], ["S"], axis=0), n("Shape", ["X"], ["sh"]),
              n("Gather", ["sh", "zero"], ["d"]), n("Add", ["d", "d"], ["dd"]),
              n("Identity", ["S"], ["S2"]), n("SequenceAt", ["S2", "dd"], ["Y"], name="far")], x, SEQ_CONSTS)
    refused(fsdpc, work, "seq_position_range", m, "node 'far' (SequenceAt)", "position 8 is outside [-4, 4)")
    m = make([n("SplitToSequence", ["X"], ["S"], axis=0), n("Add", ["S", "X"], ["Y"], name="add")], x, {})
    refused(fsdpc, work, "seq_read_as_tensor", m, "node 'add' (Add)", "reads the sequence 'S'")
    m = make([n("SplitToSequence", ["X"], ["Y"], axis=0)], x, {})
    refused(fsdpc, work, "seq_output", m, "graph output 'Y' is a sequence")
    m = make([n("Shape", ["X"], ["sp"]), n("SplitToSequence", ["X", "X"], ["S"], name="sts"),
              n("ConcatFromSequence", ["S"], ["Y"])], x, {})
    refused(fsdpc, work, "seq_split_input", m, "node 'sts' (SplitToSequence)", "split input 'X' must be a constant")


# ---- opset 23's composite ops ----------------------------------------------------------------------

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "opset23")


def opset23(fsdpc, work):
    """the committed models and ReferenceEvaluator outputs of gen_opset23.py; then the gradient"""
    names = sorted(f[:-5] for f in os.listdir(DATA) if f.endswith(".onnx"))
    check(len(names) >= 5, "tests/data/opset23 holds %d models" % len(names))
    for name in names:
        d = np.load(os.path.join(DATA, name + ".npz"))
        m = onnx.load(os.path.join(DATA, name + ".onnx"))
        inputs = {k: d[k] for k in d.files if not k.startswith("out.")}
        outs = [k[4:] for k in d.files if k.startswith("out.")]
        for o, y in zip(outs, evaluate(fsdpc, work, name, m, inputs, outs)):
            want = d["out." + o]
            tol = 1e-5 if want.dtype == np.float32 else 1e-10
            check(y.shape == want.shape and y.dtype == want.dtype and np.allclose(y, want, rtol=tol, atol=tol),
                  "%s: output %s %s %s, onnx.reference %s %s" % (name, o, y.shape, y.ravel()[:4], want.shape,
                                                                 want.ravel()[:4]))
        print("ok %-28s = onnx.reference (opset %d; %s)" % (name, m.opset_import[0].version, ", ".join(outs)))
    # the same Attention in a training build, where passes/attention.c fuses it (--eval leaves it unfused): the
    # output Y alone (qk_matmul_output keeps it unfused), the inputs as initializers, one SGD step of lr 0 towards
    # the reference's Y: a loss of 0 (its row that attends nothing included), from one FusedAttention (zero_rows)
    for name in ("attention_gqa_causal_past", "attention_window"):
        d = np.load(os.path.join(DATA, name + ".npz"))
        m = onnx.load(os.path.join(DATA, name + ".onnx"))
        want = d["out.Y"]
        att = helper.make_node("Attention", list(m.graph.node[0].input), ["Y"], name="at")
        att.attribute.extend(a for a in m.graph.node[0].attribute if a.name != "qk_matmul_output_mode")
        inputs = {k: d[k] for k in d.files if not k.startswith("out.")}
        mk = lambda w: make([att], {}, {**w, **{k: v for k, v in inputs.items() if v.dtype == np.bool_}},
                            opset=m.opset_import[0].version)
        tag = name + "_train"
        loss, _ = train_step(fsdpc, work, tag, mk, {k: v for k, v in inputs.items() if v.dtype != np.bool_},
                             want, 0.0)
        check(loss <= 1e-24, "%s: mean squared difference from onnx.reference %.3g" % (tag, loss))
        out = run([fsdpc, os.path.join(work, tag, "model.onnx"), "--target", "cpu", "--loss", "mse:Y,T",
                   "--dump-after", "attention"]).stdout.split("nodes:")[1]
        check(out.count("= FusedAttention ") == 1 and ("zero_rows=1" in out) == ("mask" in inputs) and
              "= Softmax " not in out,
              "%s: not fused:\n%s" % (tag, out))
        print("ok %-28s = onnx.reference in a training build, fused (loss %.3g)" % (tag, loss))
    rms = lambda v: make([helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], axis=-2, epsilon=1e-2)],
                         {}, v, opset=23)
    eps = float(str(np.float32(1e-2)))  # a float attribute: its float32's shortest decimal
    gradcheck(fsdpc, work, "rms_train", rms, {"X": r(2, 3, 4), "scale": r(3, 4)},
              lambda v: v["X"] / np.sqrt((v["X"] ** 2).mean((1, 2), keepdims=True) + eps) * v["scale"])


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    functions(fsdpc, work)
    sequences(fsdpc, work)
    opset23(fsdpc, work)


if __name__ == "__main__":
    main()
