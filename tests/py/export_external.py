"""--export-onnx of a model saved with external data is self-contained.

usage: export_external.py FSDPC WORKDIR

An MLP (x @ W1 + b1, Relu, @ W2 + b2, Reshape by an int64 shape
initializer) saved with every initializer in one external file
(onnx.save_model(..., save_as_external_data=True, size_threshold=0)); fsdpc
compiles it with --freeze W2, it trains 2 steps at world 2 and exports ONNX
and safetensors; then the original directory is removed.  Checked: the
export's tensors of 1 KiB or more (W1) sit in TRAINED.onnx.data beside it,
naming that bare file name, the smaller ones (the untrained W2 and shape
among them) are inline, as onnx.save's threshold puts them (onnxruntime
needs a Reshape's shape inline); onnx.load and onnx.checker accept the export,
also moved to another directory; the trained W1, b1, b2 equal the
safetensors export's and moved; the untrained W2 (frozen) and shape equal
the original's; the safetensors file holds every float initializer (W2
with its original values); no temporary file is left.  The same model
saved inline exports inline (no data file).
"""
import copy
import json
import os
import shutil
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, mpirun, run


def model(rng):
    """the initializers by name, and the ModelProto"""
    inits = {"W1": rng.standard_normal((16, 32)).astype(np.float32) * 0.3,
             "b1": rng.standard_normal(32).astype(np.float32) * 0.1,
             "W2": rng.standard_normal((32, 1)).astype(np.float32) * 0.3,
             "b2": np.array([0.05], np.float32),
             "shape": np.array([-1, 1], np.int64)}
    nodes = [helper.make_node("MatMul", ["x", "W1"], ["h0"]), helper.make_node("Add", ["h0", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["h2"]), helper.make_node("MatMul", ["h2", "W2"], ["y0"]),
             helper.make_node("Add", ["y0", "b2"], ["y1"]), helper.make_node("Reshape", ["y1", "shape"], ["y"])]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return inits, helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def read_safetensors(path):
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    dt = {"F32": np.float32, "F64": np.float64}
    return {k: np.frombuffer(raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]],
                             dt[v["dtype"]]).reshape(v["shape"]) for k, v in head.items()}


def train(fsdpc, work, src, name):
    """compile src, train 2 steps at world 2, export into work/name/; the export's paths"""
    exe = os.path.join(work, name + "_exe")
    run([fsdpc, src, "-o", exe, "--target", "cpu", "--loss", "mse:y,t", "--dim", "batch=4", "--freeze", "W2"])
    out = os.path.join(work, name)
    os.makedirs(out)
    onnx_path, st = os.path.join(out, "trained.onnx"), os.path.join(out, "trained.safetensors")
    run(mpirun(2, [exe, "--data", "x=" + os.path.join(work, "x.npy"), "--data", "t=" + os.path.join(work, "t.npy"),
                   "--steps", "2", "--quiet", "--export-onnx", onnx_path, "--export-safetensors", st]))
    return out, onnx_path, st


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    rng = np.random.default_rng(0)
    np.save(os.path.join(work, "x.npy"), rng.standard_normal((32, 16)).astype(np.float32))
    np.save(os.path.join(work, "t.npy"), rng.standard_normal((32, 1)).astype(np.float32))
    inits, m = model(rng)
    m_inline = copy.deepcopy(m)  # save_model with external data rewrites m
    orig = os.path.join(work, "orig")
    os.makedirs(orig)
    onnx.save_model(m, os.path.join(orig, "mlp.onnx"), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    out, onnx_path, st = train(fsdpc, work, os.path.join(orig, "mlp.onnx"), "out")
    shutil.rmtree(orig)

    check(sorted(os.listdir(out)) == ["trained.onnx", "trained.onnx.data", "trained.safetensors"],
          "the export directory holds %s" % sorted(os.listdir(out)))
    bare = onnx.load(onnx_path, load_external_data=False)
    for t in bare.graph.initializer:  # 1 KiB or more external (onnx.save's threshold), the rest inline:
        big = inits[t.name].nbytes >= 1024  # onnxruntime needs e.g. a Reshape's shape inline
        check((t.data_location == TensorProto.EXTERNAL) == big, "initializer %s (%d B) is %s in the export"
              % (t.name, inits[t.name].nbytes, "inline" if big else "external"))
        loc = {e.key: e.value for e in t.external_data}
        check(not big or loc.get("location") == "trained.onnx.data", "initializer %s: external data %s" % (t.name, loc))
    onnx.checker.check_model(onnx_path)
    moved = os.path.join(work, "moved")
    os.makedirs(moved)
    for f in ("trained.onnx", "trained.onnx.data"):
        shutil.copy(os.path.join(out, f), moved)
    cwd = os.getcwd()
    os.chdir("/")
    try:
        w = {t.name: numpy_helper.to_array(t) for t in onnx.load(onnx_path).graph.initializer}
        w2 = {t.name: numpy_helper.to_array(t) for t in onnx.load(os.path.join(moved, "trained.onnx")).graph.initializer}
    finally:
        os.chdir(cwd)
    sw = read_safetensors(st)
    check(sorted(w) == sorted(inits), "the export holds %s" % sorted(w))
    check(sorted(sw) == ["W1", "W2", "b1", "b2"], "the safetensors export holds %s" % sorted(sw))
    for k in ("W1", "b1", "b2"):
        check(not np.array_equal(w[k], inits[k]), "trained %s did not change" % k)
        check(np.array_equal(w[k], sw[k]) and np.array_equal(w2[k], sw[k]), "trained %s differs from safetensors'" % k)
    for k in ("W2", "shape"):
        check(w[k].dtype == inits[k].dtype and np.array_equal(w[k], inits[k]) and np.array_equal(w2[k], inits[k]),
              "untrained %s differs from the original's" % k)
    check(np.array_equal(sw["W2"], inits["W2"]), "frozen W2 in safetensors differs from the original's")
    print("external: trained.onnx + trained.onnx.data load and check from any directory without the original; "
          "W1 b1 b2 trained (= safetensors), W2 shape as the original")

    # the same model inline: the export stays inline
    inline = os.path.join(work, "inline.onnx")
    onnx.save(m_inline, inline)
    out, onnx_path, _ = train(fsdpc, work, inline, "out_inline")
    check(sorted(os.listdir(out)) == ["trained.onnx", "trained.safetensors"],
          "inline: the export directory holds %s" % sorted(os.listdir(out)))
    check(all(t.data_location != TensorProto.EXTERNAL for t in onnx.load(onnx_path).graph.initializer),
          "inline: the export has external tensors")
    print("OK export_external: self-contained exports of external-data models; inline models stay inline")


if __name__ == "__main__":
    main()
