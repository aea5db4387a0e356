"""tests/gpu/run.sh prepare: everything the GPU run needs, built on a CPU machine.

usage: /usr/bin/python3 tests/gpu/prep.py OUTDIR FSDPC [--quick]

Writes into OUTDIR (flat, so it can be carried to the GPU machine whole):
  manifest.json        the models: how to run them, their CPU reference losses,
                       parameters, FLOPs per step, the compile-time memory plan
  gpt_check            examples/gpt.onnx (2 layers, d 64, T 64), batch 8, AdamW:
                       --target cuda executable (+ .init), the token file, and
                       the --target cpu run's losses (the reference)
  gpt_check_bf16       the same with --precision bf16 (both targets)
  gpt_check_fp16       the same with --precision fp16 (dynamic loss scaling)
  resnet_check         torchvision ResNet-18 (10 classes), float32, 64x64,
                       batch 16, SGD with momentum (--lr 1e-4, 3 steps):
                       the same, data as .npy
  resnet_check_fp64    the same model and data in float64 (the cuda
                       target's float64 kernels and cuBLASLt's FP64 GEMM;
                       its weights tiled with half the period, to compress)
  gpt_bench            a GPT-2-small-shaped model (default 12 layers, d 768,
                       12 heads, T 1024, vocab 50304, batch 8): cuda only
  gpt_bench_bf16       the same with --precision bf16 (the issue's benchmark)
  resnet_bench         ResNet-18 (1000 classes), 224x224, batch 128: cuda only
  cuda_rt_dev_test     the device layer's own test (if the build has it)
Large .init files are stored xz-compressed (*.init.xz, LZMA preset 1): the
benchmark models' initial weights are random normal numbers repeating with a
period of 4093 values (scaled to each tensor's std), which LZMA compresses
~2000x (gzip: ~120x, its matches being at most 258 bytes: the GPT-2-small
.init, 998 MiB, was 8.2 MiB gzipped), so that a 124M-parameter model fits
what travels to the GPU machine; speed does not depend on the values.
(ResNet check weights are tiled too.)

Environment: GPT_BENCH="layers,embd,heads,T,vocab,batch" and
RESNET_BENCH="size,batch" override the benchmark shapes; PREP_MODELS="gpt_bench,..."
builds only the models it names (a shorter GPU call); PREP_KEEP_CPU=1 keeps the --target cpu
executables (to look at a check's reference).  Models with the same initial weights share one
.init (the others get --init): the full package is 36 MiB.
--quick: small benchmark shapes (to try this script out).
"""
import copy
import hashlib
import lzma
import json
import os
import re
import shutil
import subprocess
import sys
import time
import warnings

import numpy as np
import torch
import torchvision

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, GPTConfig, export as export_gpt  # noqa: E402

PERIOD = 4093
LOSS = ["--loss", "cross_entropy:logits,labels"]
# cuda vs cpu, relative, every step: fp32 (FSDPC_NO_TF32=1) differs in summation order only; bf16
# also where an operand rounds to the neighbouring bfloat16 (2^-8 apart) because the float32 sums
# before it differ in the last bit; fp16 likewise with float16's neighbours (2^-11 apart), the loss
# scale moving the same way on both targets (a step skipped on one only would show in the losses)
TOL = {"fp32": 1e-4, "bf16": 2e-3, "fp16": 1e-3, "fp64": 1e-9}


def log(msg):
    print("prep: " + msg, flush=True)


def run(cmd, timeout=3600, env=None):
    e = dict(os.environ)
    e.setdefault("OPENBLAS_NUM_THREADS", str(os.cpu_count() or 1))
    e.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
    if env:
        e.update(env)
    t0 = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=timeout)
    if p.returncode != 0:
        raise SystemExit("prep: FAILED (%d): %s\nstdout:\n%s\nstderr:\n%s"
                         % (p.returncode, " ".join(cmd), p.stdout[-4000:], p.stderr[-4000:]))
    return p, time.time() - t0


def tile_weights(model, seed=0, period=PERIOD):
    """every parameter with spread becomes base[i % period] * std + mean (same scale, compressible: period x the
    element size stays below gzip's 32 KiB window, and LZMA's)"""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(period, generator=g, dtype=torch.float64)
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            if n < 2:
                continue
            std, mean = p.double().std().item(), p.double().mean().item()
            if std == 0:
                continue
            reps = -(-n // period)
            p.copy_((base.repeat(reps)[:n] * std + mean).view_as(p).to(p.dtype))


def nparams(model):
    return sum(p.numel() for p in model.parameters())  # tied weights once


def export_resnet(model, path, size, dtype=torch.float32):
    x = torch.zeros(2, 3, size, size, dtype=dtype)
    with warnings.catch_warnings():  # "Removing mutation from node aten::add_ on ... num_batches_tracked"
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, input_names=["x"], output_names=["logits"],
                          dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}})


def resnet_fwd_flops(model, size):
    """2 x multiply-adds of every Conv2d and Linear for one image (BN, ReLU, pooling, adds not counted)"""
    macs = [0]

    def hook(mod, inp, out):
        if isinstance(mod, torch.nn.Conv2d):
            k = mod.in_channels // mod.groups * mod.kernel_size[0] * mod.kernel_size[1]
            macs[0] += out[0].numel() * k
        elif isinstance(mod, torch.nn.Linear):
            macs[0] += mod.in_features * mod.out_features
    hs = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    m = copy.deepcopy(model).eval()
    with torch.no_grad():
        m(torch.zeros(1, 3, size, size, dtype=next(m.parameters()).dtype))
    for h in hs:
        h.remove()
    return 2 * macs[0]


def plan_bytes(fsdpc, onnx_path, flags):
    p, _ = run([fsdpc, onnx_path] + flags + ["--report", "--world", "1"])
    m = re.search(r"planned peak\s+(\d+) B", p.stdout)
    if not m:
        raise SystemExit("prep: no 'planned peak' in fsdpc --report:\n" + p.stdout[-2000:])
    return int(m.group(1)), p.stdout


def compile_both(fsdpc, onnx_path, out, name, flags, cpu):
    """cuda executable OUT/name (and OUT/name_cpu for the reference); the plan; the report text"""
    plan, report = plan_bytes(fsdpc, onnx_path, flags)
    with open(os.path.join(out, name + ".report.txt"), "w") as f:
        f.write(report)
    _, t = run([fsdpc, onnx_path, "-o", os.path.join(out, name), "--target", "cuda", "--arch", "sm_90"] + flags)
    log("%s: --target cuda built in %.1f s (plan %.3f GiB per rank)" % (name, t, plan / 2**30))
    if cpu:
        _, t = run([fsdpc, onnx_path, "-o", os.path.join(out, name + "_cpu"), "--target", "cpu"] + flags)
        log("%s: --target cpu built in %.1f s" % (name, t))
    return plan


def cpu_losses(out, name, args, steps, precision, tol):
    """the --target cpu run's losses, and the check's own sensitivity: the largest relative change of a loss when
    the learning rate moves by one rounding unit of the master weights' dtype (2^-23; float64: 2^-52), or every
    element of the float --data inputs by one rounding unit of its dtype, up or down at random: what a different
    summation order does to every update and activation.  (The learning rate alone understates it: ResNet-18 at
    --lr 1e-3 moved 2.2e-6 by step 5 with it, 2.2e-4 with the nudged images, and the GPU differed by 2.8e-4.)  A
    check whose sensitivity is within 10x of its tolerance measures the model's chaos, not the cuda target
    (ResNet-18 at --lr 0.01 moved 2.6e-2 by step 8): refused."""
    def losses_at(lr_args, tag):
        metrics = os.path.join(out, "%s_cpu%s.jsonl" % (name, tag))
        _, t = run([os.path.join(out, name + "_cpu")] + lr_args + ["--steps", str(steps), "--metrics", metrics,
                                                                   "--quiet"],
                   env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
        got = [json.loads(l)["loss"] for l in open(metrics) if '"step"' in l]
        if len(got) != steps:
            raise SystemExit("prep: %s: %d CPU losses, expected %d" % (name, len(got), steps))
        return got, t
    losses, t = losses_at(args, "")
    log("%s: CPU reference, %d steps in %.1f s: loss %.6f -> %.6f" % (name, steps, t, losses[0], losses[-1]))
    i = args.index("--lr") + 1
    nudged = list(args)
    nudged[i] = "%.17g" % (float(args[i]) * (1 + 2.0 ** (-52 if precision == "fp64" else -23)))
    other, _ = losses_at(nudged, "_nudged")
    os.remove(os.path.join(out, "%s_cpu_nudged.jsonl" % name))
    sens = [abs(a - b) / abs(b) for a, b in zip(other, losses)]
    log("%s: sensitivity to one rounding unit of the learning rate: %s" % (name, " ".join("%.1e" % x for x in sens)))
    data = list(args)
    rng = np.random.default_rng(7)
    made = []
    for i, a in enumerate(args):
        if i and args[i - 1] == "--data" and a.endswith(".npy"):
            key, _, path = a.partition("=")
            x = np.load(os.path.join(out, path))
            if x.dtype.kind != "f":
                continue
            up = rng.integers(0, 2, x.shape).astype(bool)
            y = np.where(up, np.nextafter(x, x.dtype.type(np.inf)), np.nextafter(x, x.dtype.type(-np.inf)))
            made.append(os.path.join(out, "nudged_" + path))
            np.save(made[-1], y.astype(x.dtype))
            data[i] = "%s=nudged_%s" % (key, path)
    if made:
        other, _ = losses_at(data, "_data")
        for f in made + [os.path.join(out, "%s_cpu_data.jsonl" % name)]:
            os.remove(f)
        dsens = [abs(a - b) / abs(b) for a, b in zip(other, losses)]
        log("%s: sensitivity to one rounding unit of the inputs: %s" % (name, " ".join("%.1e" % x for x in dsens)))
        sens = [max(a, b) for a, b in zip(sens, dsens)]
    if max(sens) * 10 > tol:
        raise SystemExit("prep: %s: the check is too chaotic for its tolerance %g: one rounding unit of the "
                         "learning rate or the inputs moves a loss by %.2g; use a smaller --lr or fewer steps"
                         % (name, tol, max(sens)))
    return losses, sens


def pack_init(out, name):
    """OUT/name.init -> OUT/name.init.xz (gpu_run.py unpacks it); its file name"""
    src = os.path.join(out, name + ".init")
    with open(src, "rb") as f, lzma.open(src + ".xz", "wb", preset=1) as g:
        shutil.copyfileobj(f, g, 1 << 24)
    log("%s.init: %.1f MiB -> %.2f MiB xz" % (name, os.path.getsize(src) / 2**20,
                                              os.path.getsize(src + ".xz") / 2**20))
    os.remove(src)
    return name + ".init.xz"


def gpt_check(fsdpc, out, steps, precision="fp32"):
    name, B, T = "gpt_check" + ("" if precision == "fp32" else "_" + precision), 8, 64
    corpus = "/usr/share/common-licenses/GPL-3"
    toks = np.frombuffer(open(corpus, "rb").read(), np.uint8).astype("<u2")
    toks.tofile(os.path.join(out, "gpt_check.tokens.bin"))  # both precisions read it
    flags = LOSS + ["--optimizer", "adamw", "--dim", "batch=%d" % B, "--wrap", "size:30000",
                    "--precision", precision]
    onnx_path = os.path.join(ROOT, "examples", "gpt.onnx")
    plan = compile_both(fsdpc, onnx_path, out, name, flags, cpu=True)
    args = ["--tokens", "gpt_check.tokens.bin", "--lr", "1e-3", "--weight-decay", "0.01"]
    cwd = os.getcwd()
    os.chdir(out)
    try:
        losses, sens = cpu_losses(out, name, args, steps, precision, TOL[precision])
    finally:
        os.chdir(cwd)
    import onnx
    n = sum(int(np.prod(t.dims)) for t in onnx.load(onnx_path).graph.initializer if not t.name.endswith(".mask"))
    return dict(name=name, kind="gpt", exe=name, init=name + ".init", args=args, steps=steps, check=True,
                precision=precision, tol=TOL[precision], cpu_losses=losses, cpu_sensitivity=sens, params=n, unit="tokens",
                items_per_step=B * T, flops_per_step=6 * n * B * T, plan_bytes=plan, batch=B, config=dict(T=T, source="examples/gpt.onnx"))


def resnet_check(fsdpc, out, steps, precision="fp32"):
    name, B, S, classes, N = "resnet_check" + ("" if precision == "fp32" else "_" + precision), 16, 64, 10, 32
    dt = np.float64 if precision == "fp64" else np.float32
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=classes)
    tile_weights(model, seed=1, period=PERIOD // 2 if precision == "fp64" else PERIOD)  # 8-byte elements
    model.train()
    if precision == "fp64":
        model = model.double()
    onnx_path = os.path.join(out, name + ".onnx")
    export_resnet(model, onnx_path, S, torch.float64 if precision == "fp64" else torch.float32)
    rng = np.random.default_rng(0)
    np.save(os.path.join(out, name + "_x.npy"), rng.standard_normal((N, 3, S, S)).astype(dt))
    np.save(os.path.join(out, name + "_labels.npy"), rng.integers(0, classes, N).astype(np.int64))
    flags = LOSS + ["--optimizer", "sgd", "--dim", "batch=%d" % B, "--wrap", "size:2000000"]
    plan = compile_both(fsdpc, onnx_path, out, name, flags, cpu=True)
    # --lr 1e-3 for 5 steps was too chaotic for float32: one rounding unit of the images moved step 5's loss by
    # 2.2e-4 (the first GPU run, an H200, differed by 2.8e-4 while the float64 run agreed to 5e-16); at 1e-4,
    # 1.7e-5 by step 5 and 3.7e-6 by step 3 (float32 runs 3 steps)
    args = ["--data", "x=%s_x.npy" % name, "--data", "labels=%s_labels.npy" % name, "--lr", "0.0001",
            "--momentum", "0.9"]
    cwd = os.getcwd()
    os.chdir(out)
    try:
        losses, sens = cpu_losses(out, name, args, steps, precision, TOL[precision])
    finally:
        os.chdir(cwd)
    os.remove(onnx_path)
    fl = resnet_fwd_flops(model, S)
    return dict(name=name, kind="resnet", exe=name, init=pack_init(out, name), args=args, steps=steps, check=True,
                precision=precision, tol=TOL[precision], cpu_losses=losses, cpu_sensitivity=sens, params=nparams(model), unit="images", items_per_step=B,
                flops_per_step=3 * fl * B, plan_bytes=plan, batch=B, config=dict(size=S, classes=classes))


def gpt_bench(fsdpc, out, steps, shape, precision="fp32"):
    L, D, H, T, V, B = shape
    name = "gpt_bench" + ("" if precision == "fp32" else "_" + precision)
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=V, n_layer=L, n_head=H, n_embd=D, block_size=T, dropout=0.0, tied=True)
    model = GPT(cfg)
    tile_weights(model, seed=2)
    onnx_path = os.path.join(out, name + ".onnx")
    t0 = time.time()
    export_gpt(model, onnx_path, 1, T)
    log("%s: exported %d parameters in %.1f s" % (name, nparams(model), time.time() - t0))
    import onnx
    shapes = [[t.name, list(t.dims)] for t in onnx.load(onnx_path, load_external_data=False).graph.initializer]
    flags = LOSS + ["--optimizer", "adamw", "--dim", "batch=%d" % B, "--wrap", "size:%d" % max(12 * D * D, 1000),
                    "--precision", precision]
    plan = compile_both(fsdpc, onnx_path, out, name, flags, cpu=False)
    os.remove(onnx_path)
    n = nparams(model)
    return dict(name=name, kind="gpt", exe=name, init=pack_init(out, name),
                args=["--tokens", name + ".tokens.bin", "--lr", "3e-4", "--weight-decay", "0.1"], steps=steps,
                check=False, precision=precision, params=n, unit="tokens", items_per_step=B * T, flops_per_step=6 * n * B * T,
                plan_bytes=plan, batch=B, gen=dict(tokens=(steps + 2) * B * T + 1, vocab=V),
                config=dict(vocab=V, layers=L, heads=H, embd=D, T=T, tied=True, onnx_shapes=shapes))


def resnet_bench(fsdpc, out, steps, shape):
    S, B = shape
    name, classes = "resnet_bench", 1000
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=classes)
    tile_weights(model, seed=3)
    model.train()
    onnx_path = os.path.join(out, name + ".onnx")
    export_resnet(model, onnx_path, S)
    flags = LOSS + ["--optimizer", "sgd", "--dim", "batch=%d" % B, "--wrap", "size:2000000"]
    plan = compile_both(fsdpc, onnx_path, out, name, flags, cpu=False)
    os.remove(onnx_path)
    fl = resnet_fwd_flops(model, S)
    return dict(name=name, kind="resnet", exe=name, init=pack_init(out, name),
                args=["--data", "x=%s_x.npy" % name, "--data", "labels=%s_labels.npy" % name, "--lr", "0.1",
                      "--momentum", "0.9"], steps=steps, check=False, params=nparams(model), unit="images",
                items_per_step=B, flops_per_step=3 * fl * B, plan_bytes=plan, batch=B,
                gen=dict(images=B, size=S, classes=classes), config=dict(size=S, classes=classes), precision="fp32")


def share_inits(out, models):
    """models whose initial weights are the same bytes (a model in fp32 and under --precision bf16 / fp16: the
    master weights are float32 either way) keep one file, the others read it with --init: the package is
    smaller (the benchmark GPT's 8 MiB once)"""
    kept = {}
    for m in models:
        path = os.path.join(out, m["init"])
        h = hashlib.sha256()
        with (lzma.open if path.endswith(".xz") else open)(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        first = kept.setdefault(h.hexdigest(), m["init"])
        if first != m["init"]:
            os.remove(path)
            m["init"] = first
            m["args"] = m["args"] + ["--init", first[:-3] if first.endswith(".xz") else first]
            log("%s: the same initial weights as %s: shared" % (m["name"], first))


def shape_env(var, default, n):
    v = os.environ.get(var)
    if not v:
        return default
    parts = [int(x) for x in v.split(",")]
    if len(parts) != n:
        raise SystemExit("prep: %s='%s': expected %d comma-separated integers" % (var, v, n))
    return tuple(parts)


def main():
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    out, fsdpc = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    quick = "--quick" in sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    torch.set_num_threads(os.cpu_count() or 1)
    gpt_shape = shape_env("GPT_BENCH", (2, 128, 4, 128, 256, 4) if quick else (12, 768, 12, 1024, 50304, 8), 6)
    resnet_shape = shape_env("RESNET_BENCH", (64, 8) if quick else (224, 128), 2)
    makers = [("gpt_check", lambda: gpt_check(fsdpc, out, 20)),
              ("gpt_check_bf16", lambda: gpt_check(fsdpc, out, 20, "bf16")),
              ("gpt_check_fp16", lambda: gpt_check(fsdpc, out, 20, "fp16")),
              ("resnet_check", lambda: resnet_check(fsdpc, out, 3)),
              ("resnet_check_fp64", lambda: resnet_check(fsdpc, out, 5, "fp64")),
              ("gpt_bench", lambda: gpt_bench(fsdpc, out, 20, gpt_shape)),
              ("gpt_bench_bf16", lambda: gpt_bench(fsdpc, out, 20, gpt_shape, "bf16")),
              ("resnet_bench", lambda: resnet_bench(fsdpc, out, 20, resnet_shape))]
    only = [s for s in os.environ.get("PREP_MODELS", "").split(",") if s]
    unknown = set(only) - {n for n, _ in makers}
    if unknown:
        raise SystemExit("prep: PREP_MODELS names %s; the models are %s"
                         % (", ".join(sorted(unknown)), ", ".join(n for n, _ in makers)))
    models = [make() for n, make in makers if not only or n in only]
    share_inits(out, models)
    for m in models if not os.environ.get("PREP_KEEP_CPU") else []:  # the CPU executables stay behind: only their losses travel
        cpu = os.path.join(out, m["exe"] + "_cpu")
        for f in (cpu, cpu + ".init"):
            if os.path.exists(f):
                os.remove(f)
    manifest = dict(created=time.strftime("%Y-%m-%d %H:%M:%S"), fsdpc=fsdpc, models=models)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
    log("wrote %s/manifest.json (%d models)" % (out, len(models)))


if __name__ == "__main__":
    main()
