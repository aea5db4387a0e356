"""Writes tests/data/opset23/: small opset-23 models of RMSNormalization (and the inputs and outputs that
onnx's ReferenceEvaluator computes for them), which functions.py checks fsdpc against with Debian's onnx 1.12,
which has no opset 23.  Run with an onnx >= 1.18 (pyenv's 1.23): python3 tests/py/gen_opset23.py"""
import os

import numpy as np
import onnx
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "opset23")
rng = np.random.default_rng(23)


def case(name, node, inputs):
    vi = lambda n, a: helper.make_tensor_value_info(n, TensorProto.DOUBLE, list(a.shape))
    g = helper.make_graph([node], name, [vi(k, v) for k, v in inputs.items()],
                          [vi("Y", inputs["X"])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 23)])
    onnx.checker.check_model(m)
    (y,) = ReferenceEvaluator(m).run(None, inputs)
    onnx.save(m, os.path.join(OUT, name + ".onnx"))
    np.savez(os.path.join(OUT, name + ".npz"), Y=y, **inputs)
    print(name, y.shape)


def main():
    os.makedirs(OUT, exist_ok=True)
    case("rms_last", helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], epsilon=1e-3),
         {"X": rng.standard_normal((2, 3, 8)), "scale": rng.standard_normal(8)})
    case("rms_axis1", helper.make_node("RMSNormalization", ["X", "scale"], ["Y"], axis=1, stash_type=1),
         {"X": rng.standard_normal((2, 3, 4)), "scale": rng.standard_normal((3, 4))})


if __name__ == "__main__":
    main()
