"""The ONNX Runtime Training side of bench/gpt_cpu.py, in its own process and virtual environment.

    ORT_PYTHON bench/ort_step.py DIR THREADS STEPS

ORT_PYTHON is a python with onnxruntime-training (the CPU wheel, onnxruntime-training-cpu) and onnx; gpt_cpu.py
makes one (a virtual environment) when none is given, and says so.  DIR holds gpt.onnx (the fsdpc side's model:
examples/gpt.py's export, training mode, its initial weights), params.json (the names of the module's parameters:
its buffers, the causal mask, are not trained) and idx.npy / lab.npy (one batch).  The model's
logits [B, T, V] are reshaped to [B*T, V] and the training artifacts are generated from it by
onnxruntime.training.artifacts: SoftmaxCrossEntropyLoss (mean), AdamW (lr 1e-4, ORT's defaults otherwise), the
parameters trained.  The thread counts are set before onnxruntime loads (OMP_NUM_THREADS and the session's
intra-op threads).  A step = forward + loss + backward (module(...)) + optimizer.step() + lazy_reset_grad().  Prints
one JSON line: the step times in ms (the first a warm-up) and the peak RSS (VmHWM).
"""
import json
import os
import sys
import time

d, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[k] = str(threads)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402
from onnxruntime.training import artifacts  # noqa: E402
from onnxruntime.training.api import CheckpointState, Module, Optimizer  # noqa: E402

ort.set_default_logger_severity(3)  # its notes on unused constants are not results
idx = np.load(os.path.join(d, "idx.npy")).astype(np.int64)
lab = np.load(os.path.join(d, "lab.npy")).astype(np.int64).reshape(-1)
m = onnx.load(os.path.join(d, "gpt.onnx"))
g = m.graph
out = g.output[0].name
vocab = g.output[0].type.tensor_type.shape.dim[-1].dim_value
g.initializer.append(numpy_helper.from_array(np.array([-1, vocab], np.int64), "ort_bench_shape"))
g.node.append(helper.make_node("Reshape", [out, "ort_bench_shape"], ["logits2d"]))
del g.output[:]
g.output.append(helper.make_tensor_value_info("logits2d", onnx.TensorProto.FLOAT, [idx.size, vocab]))
# ORT's gradient builders read the saved statistics of LayerNormalization and Dropout's mask: name them
for k, n in enumerate(g.node):
    want = {"LayerNormalization": 3, "Dropout": 2}.get(n.op_type, 0)
    while len(n.output) < want:
        n.output.append("ort_bench_%d_%d" % (k, len(n.output)))
names = set(json.load(open(os.path.join(d, "params.json"))))  # the module's parameters, not its buffers
params = [i.name for i in g.initializer if i.name in names]
art = os.path.join(d, "ort")
os.makedirs(art, exist_ok=True)
artifacts.generate_artifacts(m, requires_grad=params, frozen_params=[], loss=artifacts.LossType.CrossEntropyLoss,
                             optimizer=artifacts.OptimType.AdamW, artifact_directory=art)
so = ort.SessionOptions()
so.intra_op_num_threads = threads
so.inter_op_num_threads = 1
state = CheckpointState.load_checkpoint(os.path.join(art, "checkpoint"))
module = Module(os.path.join(art, "training_model.onnx"), state, os.path.join(art, "eval_model.onnx"), device="cpu",
                session_options=so)
opt = Optimizer(os.path.join(art, "optimizer_model.onnx"), module)
opt.set_learning_rate(1e-4)
module.train()
times = []
for _ in range(steps + 1):
    t = time.perf_counter()
    loss = module(idx, lab)
    opt.step()
    module.lazy_reset_grad()
    times.append((time.perf_counter() - t) * 1e3)
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")]
print(json.dumps({"ort": ort.__version__, "times_ms": times, "loss": float(loss), "peak_rss_bytes": hwm[0]}))
