"""Seeds for fuzz_compile from ONNX's node tests (libonnx-testdata) that reach past the frontend.

usage: seeds.py OUTDIR

Per case, as tests/py/onnx_node_tests.py prepares it for `fsdpc --eval` (lifted to opset 13 when below 7,
inputs in constant positions baked in as initializers): CASE.eval.onnx; and CASE.train.onnx with every
float input an initializer too (from the case's data), so that the training pipeline has parameters to
differentiate.  Cases that cannot be prepared are left out (the raw models are seeds as well).
"""
import glob
import os
import re
import sys

import numpy as np
import onnx
from onnx import numpy_helper

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from onnx_node_tests import ROOT, bake_constants, default_opset, load_pb  # noqa: E402


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    for case in sorted(os.listdir(ROOT)):
        d = os.path.join(ROOT, case)
        try:
            model = onnx.load(os.path.join(d, "model.onnx"))
            if 0 < default_opset(model) < 7:  # fsdpc reads 7-28: older cases as written
                model = onnx.version_converter.convert_version(model, 13)
            data = sorted(glob.glob(os.path.join(d, "test_data_set_0", "input_*.pb")),
                          key=lambda p: int(re.findall(r"(\d+)\.pb$", p)[0]))
            init = {t.name for t in model.graph.initializer}
            names = [vi.name for vi in model.graph.input if vi.name not in init]
            inputs = {name: load_pb(path)[1] for name, path in zip(names, data)}
            bake_constants(model, inputs)
            onnx.save(model, os.path.join(out, case + ".eval.onnx"))
            floats = [k for k, a in inputs.items() if a.dtype in (np.float32, np.float64) and a.ndim > 0]
            if not floats:
                continue
            for k in floats:
                model.graph.initializer.append(numpy_helper.from_array(inputs[k], k))
            keep = [vi for vi in model.graph.input if vi.name not in floats]
            del model.graph.input[:]
            model.graph.input.extend(keep)
            onnx.save(model, os.path.join(out, case + ".train.onnx"))
            n += 1
        except Exception:  # not preparable: the raw model is a seed still
            continue
    print("seeds.py: %d cases prepared for training in %s" % (n, out))


main()
