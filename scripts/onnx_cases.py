"""Write the ONNX backend's node test cases of the installed onnx (the PyPI wheel ships their generators, not
their data) in libonnx-testdata's layout, for tests/py/onnx_node_tests.py to run against fsdpc:

    python3 scripts/onnx_cases.py DIR          # onnx from PyPI (1.23: 1,884 cases)
    FSDPC_ONNX_NODE_DATA=DIR /usr/bin/python3 tests/py/onnx_node_tests.py build/fsdpc WORK

Each case gets DIR/NAME/model.onnx and DIR/NAME/test_data_set_0/{input,output}_K.pb.  Cases whose inputs or
outputs are not tensors (sequences, optionals: fsdpc takes tensors only) are counted and left out.
"""
import os
import shutil
import sys

import onnx
from onnx import numpy_helper
from onnx.backend.test.case.node import collect_testcases


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    written, skipped = 0, []
    for case in collect_testcases(None):
        if case.kind != "node" or not case.model:
            continue
        ins, outs = case.data_sets[0]
        try:
            tin = [numpy_helper.from_array(v) for v in ins]
            tout = [numpy_helper.from_array(v) for v in outs]
        except (TypeError, AttributeError, ValueError):
            skipped.append(case.name)
            continue
        d = os.path.join(out, case.name)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(os.path.join(d, "test_data_set_0"))
        onnx.save(case.model, os.path.join(d, "model.onnx"))
        for i, t in enumerate(tin):
            with open(os.path.join(d, "test_data_set_0", "input_%d.pb" % i), "wb") as f:
                f.write(t.SerializeToString())
        for i, t in enumerate(tout):
            with open(os.path.join(d, "test_data_set_0", "output_%d.pb" % i), "wb") as f:
                f.write(t.SerializeToString())
        written += 1
    print("onnx %s: %d node cases written to %s, %d with non-tensor inputs (sequences, optionals) left out"
          % (onnx.__version__, written, out, len(skipped)))


if __name__ == "__main__":
    main()
