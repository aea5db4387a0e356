"""ONNX's backend node tests (Debian libonnx-testdata) through `fsdpc --eval`.

usage: onnx_node_tests.py FSDPC WORKDIR [NAME_SUBSTRING...]
       onnx_node_tests.py FSDPC WORKDIR --op OPTYPE   (the cases whose graph uses OPTYPE)
       onnx_node_tests.py FSDPC WORKDIR --op OPTYPE --entries FILE
           (ctest's entry node_OPTYPE: FILE lists every entry's op.  Each case runs in one entry only,
           that of the rarest listed op its graph uses (fewest cases; ties by name), so the entries
           together run every case using a listed op exactly once.  An entry whose own cases all skip
           goes on through the other cases using its op until one passes: every entry that passes
           has run at least one case of its op)

For every case under /usr/share/libonnx-testdata/data/node: compile model.onnx
with --eval, run it on test_data_set_0/input_*.pb, compare every output with
output_*.pb (ONNX's backend tolerance: rtol 1e-3, atol 1e-7; exact for ints and
bools; a float16 / bfloat16 output within 4 units of its dtype's roundoff).  fsdpc has static shapes, so inputs that an op needs as constants
(Reshape's shape, Slice's starts, ...) are baked into the model as
initializers from the case's own data before compiling.

Cases written at opsets below 7 are first lifted to opset 13 with ONNX's own
version converter (fsdpc reads 7-28: an older case runs as written, read as its
version).  A case the compiler rejects with its
"unsupported" message (an op, attribute or dtype outside the supported set) is
skipped and counted by reason; every other failure fails the test.
"""
import collections
import glob
import json
import os
import re
import sys

import numpy as np
import onnx
import onnx.version_converter
from onnx import numpy_helper

from common import run, tidy

ROOT = os.environ.get("FSDPC_ONNX_NODE_DATA", "/usr/share/libonnx-testdata/data/node")  # or scripts/onnx_cases.py's
CONST_INPUTS = {"Reshape": [1], "Expand": [1], "Tile": [1], "Slice": [1, 2, 3, 4], "Unsqueeze": [1],
                "Squeeze": [1], "Pad": [1, 2], "ConstantOfShape": [0], "Range": [0, 1, 2], "Split": [1],
                "ReduceSum": [1], "Clip": [1, 2], "Dropout": [1, 2], "Trilu": [1], "OneHot": [1],
                "TopK": [1], "Resize": [1, 2, 3], "Upsample": [1], "CumSum": [1], "CumProd": [1],
                "RNN": [4], "GRU": [4], "LSTM": [4],  # sequence_lens
                "CenterCropPad": [1], "AffineGrid": [1], "ReverseSequence": [1],
                "HannWindow": [0], "HammingWindow": [0], "BlackmanWindow": [0],
                # axes: an input from opset 18
                **{op: [1] for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                                      "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp")}}
SKIP = re.compile(r"unsupported|not supported|does not support|fsdpc supports|opset|only rank|no dimension|static shapes")


def bake_constants(model, inputs):
    """Turn graph inputs used in constant positions into initializers."""
    names = {}
    for node in model.graph.node:
        for pos in CONST_INPUTS.get(node.op_type, []):
            if pos < len(node.input) and node.input[pos]:
                names[node.input[pos]] = True
    keep = []
    for i, vi in enumerate(model.graph.input):
        if vi.name in names and vi.name in inputs:
            model.graph.initializer.append(numpy_helper.from_array(inputs.pop(vi.name), vi.name))
        else:
            keep.append(vi)
    del model.graph.input[:]
    model.graph.input.extend(keep)


def load_pb(path):
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return t.name, numpy_helper.to_array(t)


def out_file(name):
    s = re.sub(r"[^A-Za-z0-9_.-]", "_", name)
    return "_" + s[1:] if s.startswith(".") else s


def default_opset(model):
    return max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [0])


def run_case(fsdpc, work, case):
    d = os.path.join(ROOT, case)
    model = onnx.load(os.path.join(d, "model.onnx"))
    if 0 < default_opset(model) < 7:
        # fsdpc reads opsets 7-28; some cases were written at older opsets
        # for ops that did not change.  ONNX's own converter lifts them.
        try:
            model = onnx.version_converter.convert_version(model, 13)
        except Exception as e:
            return "skip", "unsupported: opset %d (ONNX's converter to 13 failed: %s)" % (
                default_opset(model), str(e).splitlines()[0][:60] if str(e) else type(e).__name__)
    data = sorted(glob.glob(os.path.join(d, "test_data_set_0", "input_*.pb")),
                  key=lambda p: int(re.findall(r"(\d+)\.pb$", p)[0]))
    init_names = {t.name for t in model.graph.initializer}
    for vi in list(model.graph.input) + list(model.graph.output):
        if not vi.type.HasField("tensor_type"):
            return "skip", "unsupported: non-tensor (sequence/optional) value '%s'" % vi.name
    in_names = [vi.name for vi in model.graph.input if vi.name not in init_names]
    inputs = {}
    for name, path in zip(in_names, data):
        inputs[name] = load_pb(path)[1]
    bake_constants(model, inputs)
    for vi in model.graph.input:  # a few cases' data contradict their model's static shape (castlike bfloat16)
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim]
        if vi.name in inputs and -1 not in dims and list(inputs[vi.name].shape) != dims:
            return "skip", "unsupported: static shapes: input '%s' holds %s, the model declares %s" % (
                vi.name, list(inputs[vi.name].shape), dims)
    cdir = os.path.join(work, case)
    os.makedirs(cdir, exist_ok=True)
    mpath = os.path.join(cdir, "model.onnx")
    onnx.save(model, mpath)
    exe = os.path.join(cdir, "run")
    p = run([fsdpc, mpath, "-o", exe, "--target", "cpu", "--eval", "--verify"], check=False)
    if p.returncode != 0:
        msg = (p.stderr.strip().splitlines() or ["(no message)"])[-1]
        if p.returncode == 1 and SKIP.search(msg):
            return "skip", msg
        return "fail", "compile: exit %d: %s" % (p.returncode, msg)
    args = [exe, "--out-dir", os.path.join(cdir, "out"), "--quiet"]
    for name, arr in inputs.items():
        f = os.path.join(cdir, out_file(name) + ".in.npy")
        np.save(f, arr)
        args += ["--input", "%s=%s" % (name, f)]
    p = run(args, check=False)
    if p.returncode != 0:
        e = p.stderr.strip()  # the first lines name the cause (MPI's own reports run long)
        return "fail", "run: exit %d: %s" % (p.returncode, e if len(e) <= 1500 else e[:1200] + " [...] " + e[-300:])
    for k, vi in enumerate(model.graph.output):
        ref = load_pb(os.path.join(d, "test_data_set_0", "output_%d.pb" % k))[1]
        got = np.load(os.path.join(cdir, "out", out_file(vi.name) + ".npy"))
        elem = vi.type.tensor_type.elem_type
        if elem == onnx.TensorProto.BFLOAT16:  # numpy has no bfloat16: fsdpc writes it as float32 (exact)
            ref = (ref.astype(np.uint32) << 16).view(np.float32) if ref.dtype == np.uint16 else ref.astype(np.float32)
        if got.shape != ref.shape or got.dtype != ref.dtype:
            return "fail", "output %s: %s %s, expected %s %s" % (vi.name, got.dtype, got.shape, ref.dtype, ref.shape)
        if ref.dtype.kind in "fc":
            # a 16-bit float output: the reference rounds every intermediate to 16 bits, fsdpc computes in float32
            # and rounds once, so they may differ by a few units of the 16-bit dtype's roundoff (2^-11, 2^-8)
            rtol = {onnx.TensorProto.FLOAT16: 4 * 2.0 ** -11, onnx.TensorProto.BFLOAT16: 4 * 2.0 ** -8}.get(elem, 1e-3)
            if not np.allclose(got, ref, rtol=rtol, atol=1e-7, equal_nan=True):
                return "fail", "output %s: max abs diff %.3g" % (vi.name, float(np.max(np.abs(got - ref))))
        elif not np.array_equal(got, ref):
            return "fail", "output %s differs" % vi.name
    return "pass", ""


def ops_of(case):
    m = onnx.load(os.path.join(ROOT, case, "model.onnx"), load_external_data=False)
    return {n.op_type for n in m.graph.node}


def case_ops(work):
    """every case's op types, read once per WORK by whichever entry comes first and kept in WORK/case_ops.json
    (written aside and renamed: the entries run at once); kept only while ROOT and its cases are the same"""
    path, cases = os.path.join(work, "case_ops.json"), sorted(os.listdir(ROOT))
    try:
        with open(path) as f:
            kept = json.load(f)
        if kept["root"] == ROOT and sorted(kept["ops"]) == cases:
            return {c: set(o) for c, o in kept["ops"].items()}
    except (OSError, ValueError, KeyError, TypeError):
        pass
    ops = {c: ops_of(c) for c in cases}
    os.makedirs(work, exist_ok=True)
    tmp = "%s.%d" % (path, os.getpid())
    with open(tmp, "w") as f:
        json.dump({"root": ROOT, "ops": {c: sorted(o) for c, o in ops.items()}}, f)
    os.replace(tmp, path)
    return ops


def entry_cases(op, entries, work):
    """(the cases entry `op` owns, the other cases using op), each sorted: a case is owned by the rarest
    op of `entries` its graph uses."""
    uses = {c: o & entries for c, o in sorted(case_ops(work).items())}
    count = collections.Counter(o for ops in uses.values() for o in ops)
    owner = {c: min(ops, key=lambda o: (count[o], o)) for c, ops in uses.items() if ops}
    return ([c for c in uses if owner.get(c) == op],
            [c for c in uses if op in uses[c] and owner[c] != op])


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    pats = sys.argv[3:]
    spare = []  # an entry's cases owned by other entries: run only while none of its own passed
    if pats[:1] == ["--op"] and pats[2:3] == ["--entries"]:
        with open(pats[3]) as f:
            cases, spare = entry_cases(pats[1], set(f.read().split()), work)
        work = os.path.join(work, pats[1])
        print("entry %s: %d cases of its own, %d using it owned by rarer ops' entries" % (
            pats[1], len(cases), len(spare)))
    elif pats[:1] == ["--op"]:
        cases = sorted(c for c in os.listdir(ROOT) if pats[1] in ops_of(c))
        work = os.path.join(work, pats[1])
    else:
        cases = sorted(c for c in os.listdir(ROOT) if not pats or any(p in c for p in pats))
    counts, reasons, fails = collections.Counter(), collections.Counter(), []
    for k, case in enumerate(cases + spare):
        if k == len(cases) and spare:
            if counts["pass"]:
                break
            print("none of its own cases ran: the others using %s until one passes" % pats[1])
        elif k > len(cases) and counts["pass"]:
            break
        status, msg = run_case(fsdpc, work, case)
        if status != "fail":
            tidy(os.path.join(work, case))  # a failed case's folder stays, to be read
        counts[status] += 1
        if status == "skip":
            m = re.search(r"unsupported ops? (\w+)", msg)
            reasons["op " + m.group(1) if m else re.sub(r".*: ", "", msg)[:70]] += 1
        elif status == "fail":
            fails.append("%s: %s" % (case, msg))
        else:
            print("pass", case)
    print("\nskipped by reason:")
    for r, n in reasons.most_common():
        print("  %4d  %s" % (n, r))
    for f in fails:
        print("FAIL", f)
    print("\nonnx node tests: %d passed, %d failed, %d skipped (unsupported) of %d"
          % (counts["pass"], counts["fail"], counts["skip"], sum(counts.values())))
    if not counts["pass"] and not fails and pats[:1] == ["--op"]:
        # nothing was checked: a skip ctest shows (SKIP_RETURN_CODE 77), never a pass
        print("SKIPPED: no case of %s runs: every one needs something unsupported" % pats[1])
        sys.exit(77)
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
