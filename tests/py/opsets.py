"""Every opset from 7 to 28, each op read with the semantics of the version the model imports.

usage: opsets.py FSDPC WORKDIR

Small models made with onnx.helper at the opset under test, run through
`fsdpc --eval` and compared with NumPy (rtol 1e-6 in float64):
  - ReduceMean-18 / ReduceMax-18 (opset 18, 20, 28): axes as a constant input,
    keepdims 0 and 1, no axes (all), noop_with_empty_axes=1 (the identity);
  - Split-18 (opset 18): num_outputs, evenly (6 / 3) and not (7 / 3: 3, 3, 1);
  - Pad-18 (opset 19): the axes input (pads for the listed axes only, one
    negative);
  - AveragePool-19 (opset 19): dilations;
  - the MLP of examples/ re-stamped at opsets 9 to 12 and 28 trains exactly as at 17.
  - LayerNormalization at opset 13 (ONNX's from 17; ONNX Runtime's optimizer writes it at older opsets).
Opsets 7 to 12 (opsets_old.py): each op whose version there differs from opset 13's, in small models made
with onnx.helper at opsets 7, 9, 10, 11 and 12, gives NumPy's answer and what the same model lifted to opset
13 by ONNX's version converter gives; a model of those ops trains as its opset 13 lift does; a CNN and the
MLP exported (re-stamped) at opsets 9 to 12 train as at opset 13.
Refused with one line naming the node, op and what to do (exit 1):
  - opset 29 and opset 6 (the message names the opset and the range);
  - an op newer than the model's opset (ops.def's since): Trilu at 13, CastLike at 14, Gelu at 19, Celu at 11,
    Mod at 9, Range at 10;
  - a part of an op newer than the model's opset (ops.def's SINCE_* and WAS_ATTR rows): Pad's axes input at 17,
    Attention's nonpad_kv_seqlen at 23, AveragePool's dilations at 18, Resize's antialias at 17 and
    half_pixel_symmetric at 18, ScatterND's reduction max at 17, ScatterElements' reduction at 15, Squeeze's axes
    input at 12;
  - at an old opset: BatchNormalization-7's spatial 0, Squeeze-11 with an axes input (opset 13's form);
  - ReduceMean at opset 17 with an axes input; at opset 18 with an axes attribute;
  - Split at opset 17 with num_outputs; Pad-19's wrap mode.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import opsets_old
from common import check, run

rng = np.random.default_rng(0)


def model(nodes, inputs, outputs, inits=(), opset=18):
    vi = lambda n, a: helper.make_tensor_value_info(n, TensorProto.DOUBLE, list(a.shape))
    g = helper.make_graph(nodes, "g", [vi(n, a) for n, a in inputs.items()],
                          [helper.make_tensor_value_info(n, TensorProto.DOUBLE, None) for n in outputs],
                          [numpy_helper.from_array(v, k) for k, v in dict(inits).items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def evaluate(fsdpc, work, tag, m, inputs, outputs):
    d = os.path.join(work, tag)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    onnx.save(m, path)
    run([fsdpc, path, "-o", os.path.join(d, "run"), "--target", "cpu", "--eval", "--verify"])
    args = [os.path.join(d, "run"), "--out-dir", os.path.join(d, "out"), "--quiet"]
    for k, v in inputs.items():
        np.save(os.path.join(d, k + ".npy"), v)
        args += ["--input", "%s=%s" % (k, os.path.join(d, k + ".npy"))]
    run(args)
    return [np.load(os.path.join(d, "out", o + ".npy")) for o in outputs]


def expect(fsdpc, work, tag, m, inputs, want):
    got = evaluate(fsdpc, work, tag, m, inputs, list(want))
    for (name, w), g in zip(want.items(), got):
        check(g.shape == w.shape and np.allclose(g, w, rtol=1e-6, atol=1e-12),
              "%s: %s is %s %s, expected %s %s" % (tag, name, g.shape, g.ravel()[:6], w.shape, w.ravel()[:6]))
    print("ok %-34s %s" % (tag, ", ".join("%s %s" % (k, v.shape) for k, v in want.items())))


def refuse(fsdpc, work, tag, m, *needles):
    d = os.path.join(work, tag)
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "model.onnx")
    onnx.save(m, path)
    p = run([fsdpc, path, "-o", os.path.join(d, "run"), "--target", "cpu", "--eval"], check=False)
    lines = p.stderr.strip().splitlines()
    check(p.returncode == 1 and len(lines) == 1 and all(n in lines[0] for n in needles),
          "%s: expected exit 1 and one line with %s, got %d:\n%s" % (tag, needles, p.returncode, p.stderr))
    check(not os.path.exists(os.path.join(d, "run")), "%s: an executable was written" % tag)
    print("ok %-34s refused: %s" % (tag, lines[0][lines[0].find("error"):][:110]))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    x = rng.standard_normal((2, 3, 4))
    ax = lambda *a: ("axes", np.array(a, np.int64))

    # ReduceMean / ReduceMax with axes as an input (opset 18 on)
    for opset in (18, 20, 28):
        for op, f in (("ReduceMean", np.mean), ("ReduceMax", np.max)):
            for keep in (0, 1):
                m = model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=keep)], {"x": x}, ["y"],
                          [ax(1, -1)], opset)
                expect(fsdpc, work, "%s%d_axes_keep%d" % (op, opset, keep), m, {"x": x},
                       {"y": f(x, axis=(1, 2), keepdims=bool(keep))})
    m = model([helper.make_node("ReduceMean", ["x"], ["y"])], {"x": x}, ["y"], opset=18)
    expect(fsdpc, work, "ReduceMean18_all", m, {"x": x}, {"y": np.mean(x, keepdims=True)})
    m = model([helper.make_node("ReduceMax", ["x"], ["y"], noop_with_empty_axes=1)], {"x": x}, ["y"], opset=18)
    expect(fsdpc, work, "ReduceMax18_noop", m, {"x": x}, {"y": x})
    m = model([helper.make_node("ReduceMean", ["x", "axes"], ["y"])], {"x": x}, ["y"], [ax(1)], 17)
    refuse(fsdpc, work, "ReduceMean17_axes_input", m, "ReduceMean", "opset 17", "axes")
    m = model([helper.make_node("ReduceMean", ["x"], ["y"], axes=[1])], {"x": x}, ["y"], opset=18)
    refuse(fsdpc, work, "ReduceMean18_axes_attr", m, "ReduceMean", "opset 18", "axes")

    # Split-18: num_outputs, the last part smaller when the axis does not divide
    for n in (6, 7):
        s = rng.standard_normal((2, n))
        m = model([helper.make_node("Split", ["s"], ["a", "b", "c"], axis=1, num_outputs=3)], {"s": s},
                  ["a", "b", "c"], opset=18)
        k = -(-n // 3)
        expect(fsdpc, work, "Split18_%d" % n, m, {"s": s},
               {"a": s[:, :k], "b": s[:, k:2 * k], "c": s[:, 2 * k:]})
    s = rng.standard_normal((2, 6))
    m = model([helper.make_node("Split", ["s"], ["a", "b", "c"], axis=1, num_outputs=3)], {"s": s},
              ["a", "b", "c"], opset=17)
    refuse(fsdpc, work, "Split17_num_outputs", m, "Split", "num_outputs", "opset 17")

    # Pad-18: pads for the listed axes only
    pads = ("pads", np.array([1, -1, 2, 0], np.int64))
    m = model([helper.make_node("Pad", ["x", "pads", "", "axes"], ["y"])], {"x": x}, ["y"],
              [pads, ax(2, 0)], opset=19)
    want = np.pad(x, [(0, 0), (0, 0), (1, 2)])[1:, :, :]  # axis 0: begin -1 (crop), end 0
    expect(fsdpc, work, "Pad19_axes", m, {"x": x}, {"y": want})
    m = model([helper.make_node("Pad", ["x", "pads"], ["y"], mode="wrap")], {"x": x}, ["y"],
              [("pads", np.array([0, 0, 1, 0, 0, 1], np.int64))], opset=19)
    refuse(fsdpc, work, "Pad19_wrap", m, "Pad", "wrap")

    # AveragePool-19: dilations
    im = rng.standard_normal((1, 2, 7, 7))
    m = model([helper.make_node("AveragePool", ["im"], ["y"], kernel_shape=[2, 2], dilations=[2, 2])],
              {"im": im}, ["y"], opset=19)
    want = (im[:, :, 0:5, 0:5] + im[:, :, 2:7, 0:5] + im[:, :, 0:5, 2:7] + im[:, :, 2:7, 2:7]) / 4
    expect(fsdpc, work, "AveragePool19_dilations", m, {"im": im}, {"y": want})

    # an op newer than the model's opset (ops.def's since column) is refused; LayerNormalization (ONNX's from
    # opset 17) is read at 13-16 too, as ONNX Runtime's optimizer writes it there
    for op, since, attrs in (("Trilu", 14, {}), ("CastLike", 15, {}), ("Gelu", 20, {}), ("Celu", 12, {}),
                             ("Mod", 10, {}), ("Range", 11, {})):
        ins = {"CastLike": ["x", "x"], "Mod": ["x", "x"], "Range": ["x", "x", "x"]}.get(op, ["x"])
        m = model([helper.make_node(op, ins, ["y"], name="n1", **attrs)], {"x": x}, ["y"], opset=since - 1)
        refuse(fsdpc, work, "%s%d" % (op, since - 1), m, "'n1' (%s)" % op, "opset %d op" % since,
               "opset %d" % (since - 1))
    # a part of an op newer than the model's opset (ops.def's SINCE_IN, WAS_ATTR, SINCE_ATTR, SINCE_VALUE rows; the
    # frontend's one check of them) is refused, naming the part and both opsets
    for op, opset, ins, attrs, part in (
            ("Pad", 17, ["x", "x", "", "x"], {}, "input 3 (axes) is opset 18's"),
            ("Attention", 23, ["x", "x", "x", "", "", "", "x"], {}, "input 6 (nonpad_kv_seqlen) is opset 24's"),
            ("AveragePool", 18, ["x"], {"kernel_shape": [1], "dilations": [1]}, "dilations is opset 19's"),
            ("Resize", 17, ["x", "", "x"], {"antialias": 1}, "antialias is opset 18's"),
            ("Resize", 18, ["x", "", "x"], {"coordinate_transformation_mode": "half_pixel_symmetric"},
             "coordinate_transformation_mode 'half_pixel_symmetric' is opset 19's"),
            ("ScatterND", 17, ["x", "x", "x"], {"reduction": "max"}, "reduction 'max' is opset 18's"),
            ("ScatterElements", 15, ["x", "x", "x"], {"reduction": "add"}, "reduction is opset 16's"),
            ("Squeeze", 12, ["x", "x"], {}, "takes axes as an attribute before opset 13")):
        m = model([helper.make_node(op, ins, ["y"], name="n1", **attrs)], {"x": x}, ["y"], opset=opset)
        refuse(fsdpc, work, "%s%d_newer" % (op, opset), m, "'n1' (%s)" % op, part, "opset %d" % opset)
    w, b = rng.standard_normal(4), rng.standard_normal(4)
    m = model([helper.make_node("LayerNormalization", ["x", "w", "b"], ["y"], epsilon=1e-5)], {"x": x}, ["y"],
              [("w", w), ("b", b)], opset=13)
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    expect(fsdpc, work, "LayerNormalization13", m, {"x": x}, {"y": (x - mu) / np.sqrt(var + 1e-5) * w + b})

    # the opset range
    for opset in (6, 29):
        m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": x}, ["y"], opset=opset)
        refuse(fsdpc, work, "opset%d" % opset, m, "opset %d" % opset, "7 to 28")

    # the MLP at opset 28 trains as at opset 17 (same executable text but the stamp)
    mlp = onnx.load(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples", "mlp.onnx"))
    xs = rng.standard_normal((24, 16)).astype(np.float32)
    ts = rng.standard_normal((24, 1)).astype(np.float32)
    np.save(os.path.join(work, "x.npy"), xs)
    np.save(os.path.join(work, "t.npy"), ts)
    losses = {}
    for opset in (17, 28, 9, 10, 11, 12):  # Gemm, Tanh, Relu: one meaning from opset 7 to 28
        for o in mlp.opset_import:
            if o.domain in ("", "ai.onnx"):
                o.version = opset
        path = os.path.join(work, "mlp%d.onnx" % opset)
        onnx.save(mlp, path)
        exe = os.path.join(work, "mlp%d" % opset)
        run([fsdpc, path, "-o", exe, "--target", "cpu", "--loss", "mse:y,target", "--dim", "batch=4"])
        p = run([exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "target=" + os.path.join(work, "t.npy"),
                 "--steps", "5"])
        losses[opset] = [l.split()[3] for l in p.stdout.splitlines() if l.startswith("step ")]
    for opset in (28, 9, 10, 11, 12):
        check(len(losses[17]) == 5 and losses[17] == losses[opset], "opset %d's losses %s != opset 17's %s"
              % (opset, losses[opset], losses[17]))
    print("ok the MLP at opsets 9-12 and 28 = at opset 17:", " ".join(losses[28]))
    opsets_old.main(fsdpc, work, evaluate, refuse)
    print("OK opsets: 7 to 28, each op read as its version says")


if __name__ == "__main__":
    main()
