"""Which initializers fsdpc trains: the graph signature, --params, the default rule.

usage: params.py FSDPC WORKDIR

PyTorch's dynamo exporter marks each lifted input with a metadata_props entry
pkg.torch.export.graph_signature.InputSpec.kind (PARAMETER, BUFFER, ...) on
its value_info.  Debian's onnx 1.12 cannot write metadata_props, so the
models here get those entries as wire bytes written by hand (ValueInfoProto
field 4, TensorProto field 16: StringStringEntryProto key 1, value 2), the
form torch 2.x writes.  Checked, by training one SGD step and reading the
exported weights (and --report):
  - with a signature, exactly its PARAMETERs train: a BUFFER on the
    differentiable path stays as exported (and trains without the signature);
    the kind is read from a value_info and from the initializer itself;
  - --params overrides the signature (and the default rule); --freeze takes
    its matches out of --params' set; a --params pattern that matches no
    float initializer is an error;
  - a model with a signature in which an initializer the signature does not
    name feeds a MatMul weight (what optimize=True makes: a pre-transposed
    val_0) is refused with the export recipe; --params overrides;
  - without a signature a Pow exponent (rank 1 or 0) is never trained;
  - malformed metadata_props (lengths past the end, a wrong wire type): one
    error line, no crash.
"""
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, onnx_weights, run

KEY = "pkg.torch.export.graph_signature.InputSpec.kind"


def varint(n):
    out = b""
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out += bytes([b | 0x80])
        else:
            return out + bytes([b])


def ld(field, payload):
    """a length-delimited field"""
    return varint(field << 3 | 2) + varint(len(payload)) + payload


def entry(key, value):
    return ld(1, key.encode()) + ld(2, value.encode())


def value_info(name, meta):
    """a ValueInfoProto with a name and metadata_props (field 4) bytes"""
    return ld(1, name.encode()) + meta


def save(path, nodes, inits, kinds=None, tensor_kinds=None, raw_vi=None, y_shape=(4, 4)):
    """x [4, 3] -> nodes -> y; kinds: name -> kind on a value_info; tensor_kinds: on the initializer's own
    metadata_props; raw_vi: (name, bytes of field 4 entries) written as they are"""
    kinds, tensor_kinds = kinds or {}, tensor_kinds or {}
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))
    plain = [numpy_helper.from_array(v, k) for k, v in inits.items() if k not in tensor_kinds]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], plain), opset_imports=[helper.make_opsetid("", 17)])
    g = m.graph.SerializeToString()
    for k, kind in tensor_kinds.items():
        g += ld(5, numpy_helper.from_array(inits[k], k).SerializeToString() + ld(16, entry(KEY, kind)))
    for k, kind in kinds.items():
        g += ld(13, value_info(k, ld(4, entry("other.key", "x")) + ld(4, entry(KEY, kind))))
    for name, meta in raw_vi or []:
        g += ld(13, value_info(name, meta))
    m.ClearField("graph")
    with open(path, "wb") as f:
        f.write(m.SerializeToString() + ld(7, g))


def train(fsdpc, work, tag, model, *flags):
    """one SGD step (lr 0.1) of mse(y, t); the exported weights and --report's output"""
    exe = os.path.join(work, tag)
    rep = run([fsdpc, model, "-o", exe, "--target", "cpu", "--loss", "mse:y,t", "--optimizer", "sgd", "--verify",
               "--report"] + list(flags)).stdout
    out = exe + ".out.onnx"
    run([exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "t=" + os.path.join(work, "t.npy"),
         "--steps", "1", "--lr", "0.1", "--momentum", "0", "--weight-decay", "0", "--export-onnx", out, "--quiet"])
    return onnx_weights(out), rep


def changed(w0, w1):
    return sorted(k for k in w0 if w0[k].dtype == np.float32 and not np.array_equal(w0[k], w1[k]))


def expect_error(cmd, *needles):
    p = run(cmd, check=False)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 1, "%s: exit %d, expected 1: %s" % (" ".join(cmd[1:3]), p.returncode, p.stderr[-500:]))
    check(len(lines) == 1, "%d error lines, expected 1: %s" % (len(lines), p.stderr[-1000:]))
    miss = [n for n in needles if n not in lines[0]]
    check(not miss, "error lacks %s: %s" % (miss, lines[0]))
    print("ok  error %s" % lines[0][:140])


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(3)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)
    np.save(J("x.npy"), r(4, 3))
    np.save(J("t.npy"), r(4, 4))
    # y = (x @ W + b) * s: W, b modules' parameters, s a buffer on the differentiable path
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"], name="mm"), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Mul", ["a", "s"], ["y"])]
    w0 = {"W": r(3, 4), "b": r(4), "s": 0.5 + np.abs(r(4))}
    cc = lambda model, *f: [fsdpc, model, "-o", J("never"), "--target", "cpu", "--loss", "mse:y,t"] + list(f)

    # no signature: every float initializer of rank >= 1 trains
    save(J("plain.onnx"), nodes, w0)
    w1, rep = train(fsdpc, work, "plain", J("plain.onnx"))
    check(changed(w0, w1) == ["W", "b", "s"], "default rule trained %s" % changed(w0, w1))
    check("the default rule" in rep and "W, b, s (3, 80 B)" in rep, "report: " + rep[:400])
    print("ok  default rule: W, b, s trained")

    # the signature: W PARAMETER (value_info), b PARAMETER (its TensorProto's metadata_props), s BUFFER
    save(J("sig.onnx"), nodes, w0, kinds={"W": "PARAMETER", "s": "BUFFER"}, tensor_kinds={"b": "PARAMETER"})
    w1, rep = train(fsdpc, work, "sig", J("sig.onnx"))
    check(changed(w0, w1) == ["W", "b"], "signature trained %s" % changed(w0, w1))
    check(np.array_equal(w1["s"], w0["s"]), "the BUFFER s changed")
    check("graph signature" in rep and "W, b (2, 64 B)" in rep and "fixed float initializers: s (1, 16 B)" in rep,
          "report: " + rep[:400])
    print("ok  signature: PARAMETERs W, b trained, BUFFER s kept")

    # --params overrides the signature; --freeze removes from its set
    w1, rep = train(fsdpc, work, "params_s", J("sig.onnx"), "--params", "s")
    check(changed(w0, w1) == ["s"], "--params s trained %s" % changed(w0, w1))
    check("chosen by --params" in rep, "report: " + rep[:400])
    w1, _ = train(fsdpc, work, "params_freeze", J("sig.onnx"), "--params", "*", "--freeze", "W")
    check(changed(w0, w1) == ["b", "s"], "--params '*' --freeze W trained %s" % changed(w0, w1))
    print("ok  --params s; --params '*' --freeze W")
    expect_error(cc(J("sig.onnx"), "--params", "nothing*"), "--params 'nothing*'", "matches no float initializer")
    expect_error(cc(J("sig.onnx"), "--params", "W", "--freeze", "W"), "nothing to train")

    # a folded parameter: the exporter's pre-transposed val_0 feeds the MatMul, unnamed by the signature
    fold_nodes = [helper.make_node("MatMul", ["x", "val_0"], ["h"], name="node_MatMul_1")] + nodes[1:]
    wf = {"val_0": w0["W"], "b": w0["b"], "s": w0["s"]}
    save(J("folded.onnx"), fold_nodes, wf, kinds={"b": "PARAMETER", "s": "BUFFER"})
    expect_error(cc(J("folded.onnx")), "initializer 'val_0'", "node 'node_MatMul_1' (MatMul)",
                 "torch.onnx.export(model, args, f, dynamo=True, optimize=False)", "--params")
    w1, _ = train(fsdpc, work, "folded_params", J("folded.onnx"), "--params", "val_0", "--params", "b")
    check(changed(wf, w1) == ["b", "val_0"], "--params on the folded model trained %s" % changed(wf, w1))
    print("ok  folded parameter refused; --params overrides")

    # Pow exponents (rank 1 and a scalar) are constants of the default rule; --params can name one
    pow_nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Abs", ["h"], ["a"]),
                 helper.make_node("Pow", ["a", "e"], ["p"]), helper.make_node("Pow", ["p", "e0"], ["y"])]
    wp = {"W": r(3, 4), "e": np.full(4, 1.5, np.float32), "e0": np.array(1.25, np.float32)}
    save(J("pow.onnx"), pow_nodes, wp)
    w1, rep = train(fsdpc, work, "pow", J("pow.onnx"))
    check(changed(wp, w1) == ["W"], "default rule with Pow trained %s" % changed(wp, w1))
    check("fixed float initializers: e, e0 (2, 20 B)" in rep, "report: " + rep[:400])
    w1, _ = train(fsdpc, work, "pow_params", J("pow.onnx"), "--params", "*")
    check(changed(wp, w1) == ["W", "e", "e0"], "--params '*' with Pow trained %s" % changed(wp, w1))
    print("ok  Pow exponents kept (default rule); --params trains them")

    # malformed metadata_props: one error line naming the value, no crash
    bad = {"key_past_end": ld(4, varint(1 << 3 | 2) + varint(200) + b"abc"),
           "entry_truncated": varint(4 << 3 | 2) + varint(9) + ld(1, b"k"),
           "varint_field": varint(4 << 3 | 0) + varint(5),
           "bad_wire_type": ld(4, varint(1 << 3 | 3) + b"x"),
           "huge_varint": ld(4, varint(1 << 3 | 2) + b"\xff" * 10)}
    for tag, meta in bad.items():
        path = J("bad_%s.onnx" % tag)
        save(path, nodes, w0, kinds={"W": "PARAMETER"}, raw_vi=[("s", meta)])
        if tag == "entry_truncated":  # the ValueInfoProto itself is cut: protobuf-c refuses the model
            expect_error(cc(path), "not an ONNX model")
            continue
        expect_error(cc(path), "value_info 's'", "malformed metadata_props")
    # the same initializer called a PARAMETER and a BUFFER
    save(J("conflict.onnx"), nodes, w0, kinds={"W": "PARAMETER"}, tensor_kinds={"W": "BUFFER"})
    expect_error(cc(J("conflict.onnx")), "'W'", "PARAMETER in one place")
    print("OK params")


if __name__ == "__main__":
    main()
