"""The emulated cuda executable trains other models as the cpu target does (issue 29 item 3).

usage: cuda_emulate_models.py FSDPC WORKDIR

cuda_emulate.py covers the demo GPT's strategies and schedules; this test covers other models and the 16-bit
precisions.  Each model is compiled twice with the same options, --target cpu and --target cuda --emulate (the CUDA
runtime, cuBLASLt and NCCL on the host: the same dev_cuda.c / kc_rt.c / comm_nccl.c and emitted cuda step), both
executables train on the same data with AdamW (FSDPC_NO_TF32=1: float32 GEMMs exact), and the emulated cuda run must
equal the cpu run within the tolerance: every step's loss (relative), every step-1 gradient (--dump-grads: max
difference over max |g|) and every tensor's weight update (final - initial, 2-norm of the difference over the
update's) within WEIGHT_X x the tolerance, since AdamW's m / sqrt(v) turns a rounding-level gradient difference
into a larger step where an element's gradient changes sign.  The cuda runs replay each step as a CUDA Graph
unless the line says "eager" (--no-cuda-graph).  The matrix covers each model, world size (1, 2, 4: separate
processes under mpirun, the emulated NCCL) and both step modes once, cheaply:

  llama    tests/zoo/llama (dynamo export: RMSNorm, rotary, grouped-query FusedAttention, SiLU MLP), float32:
           world 1 graph, 2 eager, 4 graph, 3 steps each; then --precision bf16 (world 2, 3 steps) and
           --precision fp16 --loss-scale-init 2^21 (world 2, 4 steps): the first steps' scaled gradients overflow
           float16, the step is skipped and the scale halves, on both targets alike (the skipped flags and loss
           scales of every step equal; at least one skip first, updates after)
  bert     tests/zoo/bert (dynamo export: LayerNorm, GELU, padding mask, pooler, tied decoder), float32:
           world 2 graph and eager
  mlp      examples/mlp.onnx (mse loss), float32, batch 8 per rank: world 4 graph, world 1 eager
  resnet   torchvision's ResNet-18 (10 classes, training-mode BatchNorm, 64x64 images, 2 per rank), one initial
           state exported in float64 and in float32, world 2 graph, 2 steps.  float64 within 1e-9.  float32: step
           1's loss within 1e-5; after it ResNet-18 at 2 samples per rank amplifies float32 rounding (BatchNorm
           over 8 values per channel in the last stage), whatever the implementation, so each target's losses,
           gradients and updates are measured against the float64 trajectory: the emulated cuda run's error at most
           max(1e-5, 3 x the cpu run's)

Attention's key bias has an exact gradient of 0 (rounding noise on both targets): checked to be below 1e-6, not
compared.  Measured (2026-11-27, AMD Zen 4): float32 losses equal to the bit, gradients <= 8.5e-7, updates <=
2.1e-5; bf16 losses equal, gradients 1.4e-7, updates 2e-7; fp16 losses 5.5e-7, gradients 2.4e-5, updates 6.4e-3
(not yet explained: see FP16_TOL); ResNet-18 float64 losses 8e-15, gradients
5e-14, updates 4e-11; float32 step 1 loss 5e-7, against float64 cuda 3.2e-6 / 2e-6 / 5.4e-4 (losses, gradients,
updates), cpu 3e-5 / 1.4e-5 / 9.4e-3.
"""
import json
import os
import shutil
import struct
import sys
import time
import warnings

import numpy as np
import torch
import torchvision

from common import check, drop, mpirun, onnx_weights, rel_err, run
from zoo import ZOO, stage

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
ADAMW = ["--lr", "1e-3", "--beta1", "0.9", "--beta2", "0.999", "--eps", "1e-8", "--weight-decay", "0.01"]
F32_TOL, F64_TOL = 1e-5, 1e-9
# bf16: the same roundings on both targets (GEMM operands, the attention's unnormalised P, dY, dS), the sums in
# other orders; 1e-4 leaves room for the cpu's widened bf16 GEMM (a CPU without AVX512-BF16: 1.2e-7 of sum |a b|).
# fp16: the Llama's step-1 gradients differ by 1.5e-5 at model.norm.weight growing to 4.8e-4 at layer 0, for any
# loss scale (2^10 .. 2^19), where bf16 agrees to 1.4e-7, nanoGPT in fp16 to 1.3e-6 and the zoo's MLP in fp16 to the
# bit.  Not explained yet; the likeliest cause is rounding flips: a float32 value one ulp apart on the two targets
# (sums in other orders) rounds to neighbouring float16 values 2^-13 of the time, bfloat16 2^-16 (on
# kernels_cuda_test's attention cases with at most 32 keys the f16 kernels' y differ by up to 5e-5, the bf16 ones'
# by 1e-7); tighten FP16_TOL when it is explained
BF16_TOL, FP16_TOL = 1e-4, 1e-3
FP16_SCALE = 2.0 ** 21
STEPS = 3
# the weights' updates within WEIGHT_X times the tolerance: AdamW's m / sqrt(v) turns an element's rounding-level
# gradient difference into a larger one where its gradient changes sign between steps
WEIGHT_X = 10
# attention's key bias: its exact gradient is 0 (q . b_k is the same for every key of a query: softmax ignores it),
# so both targets compute rounding noise there (checked to be below 1e-6) and AdamW steps it by +-lr: not compared
KEY_BIAS = (".key.bias", "k_proj.bias")


def read_weights(path):
    """name -> float64 array, from a --export-safetensors file"""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    head.pop("__metadata__", None)
    dt = {"F32": np.float32, "F64": np.float64}  # exports are the float32 (float64) master weights
    out = {}
    for k, v in head.items():
        check(v["dtype"] in dt, "%s: %s has dtype %s" % (path, k, v["dtype"]))
        a, b = v["data_offsets"]
        out[k] = np.frombuffer(raw[8 + n + a:8 + n + b], dt[v["dtype"]]).astype(np.float64)
    return out


def read_steps(path):
    """the step records of a --metrics file"""
    with open(path) as f:
        return [o for o in map(json.loads, f) if "step" in o]


def build(fsdpc, onnx_path, exe, flags):
    """exe.cpu and exe.cuda (emulated) from one ONNX file with the same compile flags"""
    for target, t in (("cpu", []), ("cuda", ["--target", "cuda", "--emulate"])):
        run([fsdpc, onnx_path, "-o", "%s.%s" % (exe, target), "--target", "cpu", "--optimizer", "adamw", "--wrap",
             "size:2000", "--quiet"] + flags + t, timeout=900)


def done(exe):
    """build()'s two executables and what their runs wrote, once compared"""
    drop(exe + ".cpu", exe + ".cuda")


def train(exe, world, data, steps, extra=()):
    """(step records, final weights) of one run"""
    metrics, st, grads = exe + ".jsonl", exe + ".safetensors", exe + ".grads"
    for p in (metrics, st):
        if os.path.exists(p):
            os.remove(p)
    shutil.rmtree(grads, ignore_errors=True)
    run(mpirun(world, [exe] + data + ["--steps", str(steps), "--metrics", metrics, "--export-safetensors", st,
                                      "--dump-grads", grads, "--quiet"] + ADAMW + list(extra)), timeout=900)
    recs = read_steps(metrics)
    check(len(recs) == steps, "%s: %d steps recorded, expected %d" % (exe, len(recs), steps))
    g = {f: np.load(os.path.join(grads, f)) for f in sorted(os.listdir(grads))}
    check(len(g) > 0, "%s: no gradients dumped" % exe)
    return recs, read_weights(st), g


def grad_err(a, b):
    """rel_err of a against b where b is finite (an fp16 step that overflowed dumps non-finite gradients): inf unless
    both are non-finite at the same elements"""
    fa, fb = np.isfinite(a), np.isfinite(b)
    if not np.array_equal(fa, fb):
        return float("inf")
    return rel_err(a[fb], b[fb]) if fb.any() else 0.0


def differences(a, b, w0):
    """(max relative loss difference, max update difference, that tensor) of run a against run b: a tensor's
    update difference is |(a - w0) - (b - w0)| / |b - w0| (2-norms; w0 its initial value), which AdamW's
    sign-like first steps make the meaningful measure (an element whose gradient is rounding noise moves by
    +-lr either way)"""
    la, lb = [r["loss"] for r in a[0]], [r["loss"] for r in b[0]]
    dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
    check(sorted(a[1]) == sorted(b[1]), "the exported tensors differ: %s vs %s" % (sorted(a[1])[:5], sorted(b[1])[:5]))
    worst = (0.0, "")
    for k, wb in b[1].items():
        if k.endswith(KEY_BIAS):
            continue
        if k not in w0:  # a tied parameter's other name (BERT's decoder weight and bias): its values as they are
            worst = max(worst, (rel_err(a[1][k], wb), k))
            continue
        num, den = float(np.linalg.norm(a[1][k] - wb)), float(np.linalg.norm(wb - w0[k]))
        worst = max(worst, (num / den if den > 0 else (0.0 if num == 0 else float("inf")), k))
    check(sorted(a[2]) == sorted(b[2]), "the dumped gradients differ: %s vs %s" % (sorted(a[2])[:5], sorted(b[2])[:5]))
    for k in [k for k in b[2] if k[:-len(".npy")].endswith(KEY_BIAS)]:
        check(max(float(np.max(np.abs(a[2][k]))), float(np.max(np.abs(b[2][k])))) <= 1e-6,
              "%s: the key bias's gradient is not rounding noise" % k)
    dg = max((grad_err(a[2][k], b[2][k]), k) for k in b[2] if not k[:-len(".npy")].endswith(KEY_BIAS))
    return dl, dg, (worst[0], worst[1])


def pair(tag, exe, w0, world, data, tol, steps=STEPS, extra=(), eager=False):
    """the emulated cuda run = the cpu run within tol (losses, weights); returns both runs"""
    t0 = time.time()
    cpu = train(exe + ".cpu", world, data, steps, extra)
    cuda = train(exe + ".cuda", world, data, steps, list(extra) + (["--no-cuda-graph"] if eager else []))
    dl, (dg, gname), (dw, wname) = differences(cuda, cpu, w0)
    what = "%s world %d %s" % (tag, world, "eager" if eager else "graph")
    check(dl <= tol and dg <= tol and dw <= WEIGHT_X * tol,
          "%s: emulated cuda vs cpu: losses %s vs %s (max rel %.3g), step-1 gradients %.3g (%s), updates %.3g (%s); "
          "tolerance %g" % (what, [r["loss"] for r in cuda[0]], [r["loss"] for r in cpu[0]], dl, dg, gname, dw,
                            wname, tol))
    print("%s: %d losses within %.2g, step-1 gradients within %.2g (%s), weight updates within %.2g (%s) [%.0f s]"
          % (what, steps, dl, dg, gname, dw, wname, time.time() - t0), flush=True)
    return cpu, cuda


def initial(onnx_path):
    """name -> the initializer's values, flat float64 (what read_weights gives)"""
    return {k: v.astype(np.float64).ravel() for k, v in onnx_weights(onnx_path).items()}


def zoo_model(name, work):
    """the zoo model's dynamo export staged in work, and its data flags"""
    src = os.path.join(ZOO, name)
    with open(os.path.join(src, "ref.json")) as f:
        ref = json.load(f)
    path = stage(ref, ref["exports"]["dynamo"], src, os.path.join(work, name))
    data = []
    for inp in ref["inputs"] + ["labels"]:
        data += ["--data", "%s=%s" % (inp, os.path.join(src, inp + ".npy"))]
    return path, data


def llama(fsdpc, work):
    path, data = zoo_model("llama", work)
    exe = os.path.join(work, "llama")
    build(fsdpc, path, exe, ["--loss", "cross_entropy:logits,labels"])
    w0 = initial(path)
    for world, eager in ((1, False), (2, True), (4, False)):
        pair("llama", exe, w0, world, data, F32_TOL, eager=eager)
    done(exe)
    build(fsdpc, path, exe + "_bf16", ["--loss", "cross_entropy:logits,labels", "--precision", "bf16"])
    pair("llama --precision bf16", exe + "_bf16", w0, 2, data, BF16_TOL)
    done(exe + "_bf16")
    build(fsdpc, path, exe + "_fp16", ["--loss", "cross_entropy:logits,labels", "--precision", "fp16"])
    cpu, cuda = pair("llama --precision fp16 --loss-scale-init 2^21", exe + "_fp16", w0, 2, data, FP16_TOL, steps=4,
                     extra=["--loss-scale-init", repr(FP16_SCALE)])
    done(exe + "_fp16")
    for key in ("skipped", "loss_scale"):
        a, b = [r.get(key) for r in cuda[0]], [r.get(key) for r in cpu[0]]
        check(a == b, "fp16: %s per step: emulated cuda %s, cpu %s" % (key, a, b))
    skips, scales = [r["skipped"] for r in cpu[0]], [r["loss_scale"] for r in cpu[0]]
    check(skips[0] and not skips[-1] and scales[1] == scales[0] / 2,
          "fp16 with loss scale 2^21: skipped %s, scales %s: expected an overflow first, then updates"
          % (skips, scales))
    print("fp16: the same %d skipped steps and loss scales %s on both targets" % (sum(skips), scales))


def bert(fsdpc, work):
    path, data = zoo_model("bert", work)
    exe = os.path.join(work, "bert")
    build(fsdpc, path, exe, ["--loss", "cross_entropy:logits,labels"])
    w0 = initial(path)
    for eager in (False, True):
        pair("bert", exe, w0, 2, data, F32_TOL, eager=eager)
    done(exe)


def mlp(fsdpc, work):
    rng = np.random.default_rng(5)
    x, t = os.path.join(work, "mlp_x.npy"), os.path.join(work, "mlp_t.npy")
    np.save(x, rng.standard_normal((32, 16)).astype(np.float32))
    np.save(t, rng.standard_normal((32, 1)).astype(np.float32))
    exe = os.path.join(work, "mlp")
    onnx_path = os.path.join(ROOT, "examples", "mlp.onnx")
    build(fsdpc, onnx_path, exe, ["--loss", "mse:y,target", "--dim", "batch=8"])
    for world, eager in ((4, False), (1, True)):
        pair("mlp", exe, initial(onnx_path), world, ["--data", "x=" + x, "--data", "target=" + t], F32_TOL, eager=eager)
    done(exe)


def export_resnet(path, dtype, size):
    """torchvision's ResNet-18 (seed 0, 10 classes) in dtype, training mode, batch dim symbolic"""
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).to(dtype)
    with warnings.catch_warnings():  # "Removing mutation from node aten::add_ on ... num_batches_tracked"
        warnings.simplefilter("ignore", UserWarning)
        torch.onnx.export(model, (torch.zeros(2, 3, size, size, dtype=dtype),), path, opset_version=17,
                          training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})


def resnet(fsdpc, work):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((4, 3, 64, 64))
    labels = os.path.join(work, "rn_labels.npy")
    np.save(labels, rng.integers(0, 10, 4).astype(np.int64))
    runs = {}
    for name, dtype, np_dtype in (("f64", torch.float64, np.float64), ("f32", torch.float32, np.float32)):
        path, xp, exe = (os.path.join(work, "resnet_%s%s" % (name, ext)) for ext in (".onnx", "_x.npy", ""))
        export_resnet(path, dtype, 64)
        np.save(xp, x.astype(np_dtype))
        build(fsdpc, path, exe, ["--loss", "cross_entropy:logits,labels", "--dim", "batch=2"])
        data = ["--data", "x=" + xp, "--data", "labels=" + labels]
        w0 = initial(path)
        if name == "f64":
            runs[name] = pair("resnet18 float64", exe, w0, 2, data, F64_TOL, steps=2)
            done(exe)
            continue
        cpu, cuda = runs[name] = pair("resnet18 float32", exe, w0, 2, data, 1.0, steps=2)  # checked below
        done(exe)
        l1 = abs(cuda[0][0]["loss"] - cpu[0][0]["loss"]) / abs(cpu[0][0]["loss"])
        check(l1 <= F32_TOL, "resnet18 float32: step 1 loss %.9g, cpu %.9g (rel %.3g)" % (cuda[0][0]["loss"],
                                                                                      cpu[0][0]["loss"], l1))
        truth = runs["f64"][0]
        (cl, (cg, _), (cw, _)), (gl, (gg, gname), (gw, wname)) = (differences(cpu, truth, w0),
                                                                   differences(cuda, truth, w0))
        check(gl <= max(F32_TOL, 3 * cl) and gg <= max(F32_TOL, 3 * cg) and gw <= max(F32_TOL, 3 * cw),
              "resnet18 float32 against float64: emulated cuda losses %.3g, step-1 gradients %.3g (%s), updates "
              "%.3g (%s); cpu %.3g, %.3g, %.3g" % (gl, gg, gname, gw, wname, cl, cg, cw))
        print("resnet18 float32: step 1 loss within %.2g; against float64: emulated cuda losses %.2g, step-1 "
              "gradients %.2g, updates %.2g; cpu %.2g, %.2g, %.2g" % (l1, gl, gg, gw, cl, cg, cw))


def main():
    fsdpc, work = os.path.abspath(sys.argv[1]), sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    os.environ["FSDPC_NO_TF32"] = "1"
    os.environ["FSDPC"] = fsdpc
    t0 = time.time()
    for model in (llama, bert, mlp, resnet):
        model(fsdpc, work)
    print("OK cuda_emulate_models: Llama, BERT, the MLP and ResNet-18 (float32, float64), bf16 and fp16 train "
          "alike on the emulated cuda target and the cpu target [%.0f s]" % (time.time() - t0))


if __name__ == "__main__":
    main()
