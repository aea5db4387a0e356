"""--target cuda without a GPU: what CI can check of the cuda target.

usage: cuda_target.py FSDPC WORKDIR

1. fsdpc --target cuda builds training executables for the shipped GPT's
   architecture (examples/gpt.onnx's sizes, exported here with QuickGELU,
   x sigmoid(1.702 x), as its MLP's activation: elementwise nodes that stay
   fused kernels, where the shipped exact GELU is one Gelu node, a library
   kernel, passes/gelu.c, and leaves the float32 GPT no fused kernel) and a
   float32 ResNet-18 (torchvision, exported in training mode), NVRTC compiling
   two programs for sm_80 and sm_90 plus PTX: the library (every kernel of
   kernels/cuda, the same for every model) and the model's own (its fused
   kernels).  The GPT, first, compiles both; the ResNet-18 takes the library
   from the kernel cache and compiles its own program alone (its stderr says
   so, and the cache holds one library entry per arch, a model entry per
   arch and model).
2. The executables need neither the driver (libcuda) nor MPI nor
   protobuf-c at load time (readelf NEEDED), embed a cubin per arch and PTX
   of both programs (the fused kernels' names among them), and, started here
   (no driver), exit non-zero with one clear line -- also at world 2 under
   mpirun, where both ranks meet through the TCP control plane first.
3. The kernel cache: a second build compiles nothing (entries untouched); a
   corrupted entry (the GPT's program for sm_90) is detected, compiled again
   (that one alone, its stderr says) and rewritten.  Two fsdpc compiling the
   same entries at once (the GPT, a cache holding the library alone): the
   first compiles the model's program for each arch, the second waits for
   each entry's lock, says so and reads it; both executables the same bytes.
   The GPT's two attentions are FusedAttention (kernels/cuda/attn.cu), forward and backward.
4. --precision bf16 builds, its step calls the bf16 GEMM and casts, and it
   fails here like the others; --rendezvous mpi is accepted, a bad one is a
   usage error.  --precision fp16 builds, its step calls the fp16 GEMM and
   casts and the loss-scaling kernels, and takes --loss-scale-init.
5. Bad cuda flags give one-line errors.
6. float64 models build: an MLP and a float64 ResNet-18 in training mode
   (convolutions, BatchNorm, pooling, cross-entropy, AdamW), their steps
   call the float64 kernels (and no float32 one) and exit with the no-GPU
   line here; --precision bf16 / fp16 refuse a float64 model in one line.
7. What the compiler says on stderr: on this machine (no NVIDIA driver) one
   note that the executable needs a driver and a GPU and that --target cpu
   trains here, once per cuda build and never for --target cpu, and another
   reason (or none) where a libcuda.so.1 loads (a stub library); a compile
   that misses the cache a line naming what it compiles (the library's
   kernels, the model's fused kernels) for which archs, NVRTC's version,
   what comes from the cache and where the cache is, one per program and
   arch compiled and the total time; a warm cache or --quiet (the fp16
   GPT, whose program is new) nothing more than the note.
8. A model of 3-D Conv, MaxPool, ConvTranspose, AveragePool and LpPool
   builds in float32 and float64, its step calling the 2-D kernels they
   are composed of, forward and backward (passes/lift3d.c).
The models after the first two (bf16, fp16, float64, 3-D) build for sm_80 alone (and its PTX): what is checked
of them is their step and its kernels, which are one text for every arch; each compiles its own small program
and takes the library for sm_80 and compute_80 from the cache.  The embedded cubin per arch and PTX are checked on the first two.
"""
import os
import re
import shutil
import subprocess
import sys

from common import export_resnet, mpirun, run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def needed(exe):
    out = subprocess.run(["readelf", "-d", exe], capture_output=True, text=True, check=True).stdout
    return [l.split("[")[1].split("]")[0] for l in out.splitlines() if "(NEEDED)" in l]


def export_gpt(path):
    """examples/gpt.onnx's GPT (vocab 256, 2 layers, 4 heads, d 64, T 64), its MLP's activation QuickGELU"""
    import copy
    import torch
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    from gpt import GPT, GPTConfig, export

    class QuickGELU(torch.nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(1.702 * x)
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=256, n_layer=2, n_head=4, n_embd=64, block_size=64, dropout=0.0))
    for block in model.transformer.h:
        block.mlp.gelu = QuickGELU()
    export(copy.deepcopy(model), path, 4, 64)


def expect_error(cmd, *words, env=None):
    p = run(cmd, check=False, env=env)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    if p.returncode == 0 or not lines or any(w not in p.stderr for w in words):
        raise SystemExit("FAILED: %s\nexpected a non-zero exit and an error with %s, got %d:\n%s%s"
                         % (" ".join(cmd), words, p.returncode, p.stdout[-2000:], p.stderr[-2000:]))
    return p, lines


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cache = os.path.join(work, "cache")
    env = {"FSDPC_CACHE_DIR": cache}
    gpt = os.path.join(work, "gpt.onnx")
    export_gpt(gpt)
    resnet = os.path.join(work, "resnet18.onnx")
    export_resnet(resnet)
    common = ["--target", "cuda", "--loss", "cross_entropy:logits,labels", "--optimizer", "adamw", "--verify"]

    # 1. build both: the first compiles the library and its own program, the second its own program alone
    exes, said, nfused = {}, {}, {}
    for name, model, extra in (("gpt", gpt, ["--dim", "batch=4", "--wrap", "size:30000"]),
                               ("resnet18", resnet, ["--dim", "batch=2", "--wrap", "size:2000000"])):
        exe = os.path.join(work, name)
        said[name] = run([fsdpc, model, "-o", exe, "--emit-c"] + common + extra, env=env, timeout=900).stderr
        exes[name] = exe
        nfused[name] = fused_count(exe + ".c")
    all3 = "sm_80, sm_90, compute_80 (PTX)"
    check_lines(said["gpt"], cache, {"kernels": all3, "model": all3}, {}, nfused["gpt"])
    check_lines(said["resnet18"], cache, {"model": all3}, {"kernels": all3}, nfused["resnet18"])
    # the GPT's attention is fused on the GPU too: attn.cu's kernels, no workspace
    src = open(exes["gpt"] + ".c").read()
    if src.count("k_attention_f32(") != 2 or src.count("k_attention_grad_f32(") != 2 or "k_softmax_f32(" in src:
        raise SystemExit("FAILED: the cuda GPT step does not call the fused attention kernels (2 + 2)")
    # the library once (sm_80, sm_90, compute_80), each model's program (its fused kernels differ) per arch
    entries = kernel_entries(cache)
    got = sorted((e.split("-", 1)[0], e.split(".", 1)[1]) for e in entries)
    want = sorted([("kernels", a) for a in ("sm_80", "sm_90", "compute_80")]
                  + [("model", a) for a in ("sm_80", "sm_90", "compute_80")] * 2)
    if got != want:
        raise SystemExit("FAILED: kernel cache holds %s, expected kernels-KEY.ARCH once and model-KEY.ARCH for "
                         "each model, for sm_80, sm_90 and compute_80" % entries)
    race_compile(fsdpc, work, cache, entries, [gpt] + common + ["--dim", "batch=4", "--wrap", "size:30000"])

    # 2. what the executables need, what they embed, how they fail here
    for name, exe in exes.items():
        libs = needed(exe)
        bad = [l for l in libs if l.startswith(("libcuda.so", "libmpi", "libprotobuf-c", "libcudart"))]
        if bad:
            raise SystemExit("FAILED: %s needs %s at load time (NEEDED: %s)" % (name, bad, libs))
        with open(exe, "rb") as f:
            blob = f.read()
        # the executable's own header, a cubin per arch and program, the fused kernels' names
        if blob.count(b"\x7fELF") < 5 or blob.count(b".target sm_80") < 2 or b"fsdpc_fused0" not in blob:
            raise SystemExit("FAILED: %s does not embed both programs' cubins and sm_80 PTX" % name)
        data = data_flags(work, name)
        p, lines = expect_error([exe, "--steps", "1"] + data, "CUDA")
        if len(lines) != 1 or "no CUDA driver" not in lines[0] and "no CUDA device" not in lines[0]:
            raise SystemExit("FAILED: %s without a GPU should print one line about the missing driver/device, "
                             "got:\n%s" % (name, p.stderr))
        print("%s: NEEDED %s; without a GPU: %s" % (name, " ".join(libs), lines[0]))
    gpt_exe = exes["gpt"]
    p, lines = expect_error(mpirun(2, [gpt_exe, "--steps", "1"] + data_flags(work, "gpt")), "CUDA",
                            env={"FSDPC_CTL_TIMEOUT": "60"})
    if sum("CUDA" in l for l in lines) != 1:
        raise SystemExit("FAILED: at world 2 exactly one rank should report the missing GPU, got:\n%s" % p.stderr)
    print("gpt at world 2 without a GPU: %s" % [l for l in lines if "CUDA" in l][0])

    # 3. the cache: nothing recompiled, corruption detected and repaired
    stamp = {e: os.stat(os.path.join(cache, e)).st_mtime_ns for e in entries}
    gpt_flags = common + ["--dim", "batch=4", "--wrap", "size:30000"]
    warm = run([fsdpc, gpt, "-o", os.path.join(work, "gpt2")] + gpt_flags, env=env).stderr
    if {e: os.stat(os.path.join(cache, e)).st_mtime_ns for e in kernel_entries(cache)} != stamp:
        raise SystemExit("FAILED: a second build with the same kernels rewrote the cache")
    if warm.splitlines() != [driver_note(warm)]:
        raise SystemExit("FAILED: a compile from a warm kernel cache should print the driver note only, got:\n%s"
                         % warm)
    check_driver_detection(fsdpc, work, gpt, gpt_flags, env)
    # the GPT's program for sm_90 (the older of the two models' entries: it was built first)
    victim = [e for e in entries if e.startswith("model-") and e.endswith("sm_90")]
    victim = os.path.join(cache, min(victim, key=lambda e: os.stat(os.path.join(cache, e)).st_mtime_ns))
    with open(victim, "r+b") as f:
        f.seek(200)
        b = f.read(1)
        f.seek(200)
        f.write(bytes([b[0] ^ 0xFF]))
    again = run([fsdpc, gpt, "-o", os.path.join(work, "gpt3")] + gpt_flags, env=env).stderr
    with open(victim, "rb") as f:
        f.seek(200)
        if f.read(1) != b:
            raise SystemExit("FAILED: a corrupted cache entry was not compiled again and rewritten")
    check_lines(again, cache, {"model": "sm_90"}, {"kernels": all3, "model": "sm_80, compute_80 (PTX)"},
                nfused["gpt"])

    # 4. --precision bf16 builds (bf16 casts and GEMMs in the step) and starts as far as this machine allows;
    # --rendezvous mpi is a run flag of cuda executables, a bad one a one-line usage error
    bf16 = os.path.join(work, "gpt_bf16")
    p = run([fsdpc, gpt, "-o", bf16, "--precision", "bf16", "--emit-c", "--arch", "sm_80"] + gpt_flags, env=env)
    check_lines(p.stderr, cache, {"model": "sm_80, compute_80 (PTX)"}, {"kernels": "sm_80, compute_80 (PTX)"},
                fused_count(bf16 + ".c"))
    src = open(bf16 + ".c").read()
    if "k_matmul_bf16(" not in src or "K_DT_BF16" not in src:
        raise SystemExit("FAILED: the bf16 cuda step calls no bf16 GEMM or cast")
    p, nogpu = expect_error([bf16, "--steps", "1", "--rendezvous", "mpi"] + data_flags(work, "gpt"), "CUDA")
    if len(nogpu) != 1:
        raise SystemExit("FAILED: gpt_bf16 without a GPU: expected one line, got:\n%s" % p.stderr)
    p, _ = expect_error([bf16, "--steps", "1", "--rendezvous", "carrier-pigeon"] + data_flags(work, "gpt"),
                            "--rendezvous", "mpi")
    if p.returncode != 2:
        raise SystemExit("FAILED: a bad --rendezvous should exit 2, got %d" % p.returncode)
    p, _ = expect_error([bf16, "--steps", "1", "--trace", os.path.join(work, "t.json")] + data_flags(work, "gpt"),
                        "--trace", "Nsight")
    if p.returncode != 2:
        raise SystemExit("FAILED: --trace on a cuda executable should exit 2, got %d" % p.returncode)
    print("gpt --precision bf16: built (bf16 GEMMs and casts in the step); without a GPU: %s" % nogpu[0])
    # --precision fp16: float16 GEMMs and casts, the loss-scaled seed, the unscaled norm and the updates reading
    # the loss scale (the kc_ twins take it from the step params uploaded before each graph replay)
    fp16 = os.path.join(work, "gpt_fp16")
    p = run([fsdpc, gpt, "-o", fp16, "--precision", "fp16", "--emit-c", "--arch", "sm_80", "--quiet"] + gpt_flags,
            env=env)
    if p.stderr.splitlines() != [driver_note(p.stderr)]:
        raise SystemExit("FAILED: a --quiet compile that misses the cache should print the driver note only, got:\n%s"
                         % p.stderr)
    src = open(fp16 + ".c").read()
    for needle in ("k_matmul_f16(", "K_DT_F16", "k_loss_seed_f32(", "k_unscale_sq_f32(", "c->loss_scale, c->micro"):
        if needle not in src:
            raise SystemExit("FAILED: the fp16 cuda step lacks %s" % needle)
    if "k_matmul_bf16(" in src or "K_DT_BF16" in src:
        raise SystemExit("FAILED: the fp16 cuda step has bfloat16 GEMMs or casts")
    p, nogpu = expect_error([fp16, "--steps", "1", "--loss-scale-init", "1024"] + data_flags(work, "gpt"), "CUDA")
    if len(nogpu) != 1:
        raise SystemExit("FAILED: gpt_fp16 without a GPU: expected one line, got:\n%s" % p.stderr)
    print("gpt --precision fp16: built (fp16 GEMMs, casts and loss scaling in the step); without a GPU: %s" % nogpu[0])
    for strategy in ("grad_op", "none", "hybrid:2"):  # the strategies build for cuda too
        run([fsdpc, gpt, "-o", os.path.join(work, "gpt_" + strategy.replace(":", "")), "--shard", strategy]
            + gpt_flags, env=env)
    run([fsdpc, gpt, "-o", os.path.join(work, "gpt_rd"), "--reduce-dtype", "bf16", "--emit-c"] + gpt_flags, env=env)
    if "rt_reduce_scatter_avg_bf16(" not in open(os.path.join(work, "gpt_rd.c")).read():
        raise SystemExit("FAILED: --reduce-dtype bf16's step does not reduce in bf16")
    print("gpt --shard grad_op / none / hybrid:2 and --reduce-dtype bf16: built")

    # 5. bad flags
    base = [fsdpc, gpt, "-o", os.path.join(work, "x"), "--loss", "cross_entropy:logits,labels", "--dim", "batch=2"]
    expect_error(base + ["--target", "cuda", "--arch", "sm_60"], "sm_70")
    expect_error(base + ["--target", "cuda", "--arch", "compute_90"], "--arch")
    expect_error(base + ["--target", "cpu", "--arch", "sm_90"], "--target cuda")
    expect_error(base + ["--target", "tpu"], "cuda or cpu")

    # 6. float64 models
    mlp64, resnet64 = os.path.join(work, "mlp64.onnx"), os.path.join(work, "resnet18_f64.onnx")
    make_f64_mlp(mlp64)
    export_resnet(resnet64, double=True)
    for name, model, extra, calls in (
            ("mlp64", mlp64, ["--loss", "mse:y,target", "--dim", "batch=2"],
             ("k_matmul_f64(", "k_mse_f64(", "k_mse_grad_f64(", "k_adamw_f64(")),
            ("resnet18_f64", resnet64, ["--loss", "cross_entropy:logits,labels", "--dim", "batch=2", "--wrap",
                                        "size:2000000", "--optimizer", "adamw"],
             ("k_conv2d_f64(", "k_conv2d_grad_w_f64(", "k_batchnorm_train_f64(", "k_batchnorm_grad_f64(",
              "k_maxpool2d_f64(", "k_global_avgpool_f64(", "k_cross_entropy_f64(", "k_adamw_f64("))):
        exe = os.path.join(work, name)
        run([fsdpc, model, "-o", exe, "--target", "cuda", "--arch", "sm_80", "--emit-c"] + extra, env=env)
        src = open(exe + ".c").read()
        missing = [c for c in calls if c not in src]
        if missing or "_f32(" in src:
            raise SystemExit("FAILED: the float64 %s step: missing %s, or a float32 kernel in it" % (name, missing))
        p, nogpu = expect_error([exe, "--steps", "1"], "CUDA")
        if len(nogpu) != 1:
            raise SystemExit("FAILED: %s without a GPU: expected one line, got:\n%s" % (name, p.stderr))
    for prec in ("bf16", "fp16"):
        expect_error([fsdpc, mlp64, "-o", os.path.join(work, "y"), "--target", "cuda", "--loss", "mse:y,target",
                      "--dim", "batch=2", "--precision", prec], "float32 model", "f64")
    print("float64 MLP and ResNet-18: built for cuda with float64 kernels only; --precision bf16/fp16 refuse them")
    check_3d(fsdpc, work, env)
    print("OK cuda_target: GPT and ResNet-18 (float32 and float64) built for sm_80, sm_90 + PTX; the library "
          "compiled once, each model's program apart; no libcuda/MPI/protobuf-c needed; clear no-GPU exit at world 1 "
          "and 2; kernel cache hit and repair; flag errors; the driver note once and NVRTC's progress; 3-D "
          "convolutions and pooling")


def race_compile(fsdpc, work, cache, entries, flags):
    """Two fsdpc compiling the same entries at once: one compiles them, the other waits for its locks and reads
    them (codegen/cuda.c).  A cache holding the library alone: the GPT's own program is what both need; the
    second starts once the first has said what it compiles (its threads hold the locks by then)."""
    race = os.path.join(work, "race_cache")
    os.makedirs(race)
    for e in entries:
        if e.startswith("kernels-"):
            shutil.copy2(os.path.join(cache, e), race)
    e = dict(os.environ, FSDPC_CACHE_DIR=race)
    first = subprocess.Popen([fsdpc] + flags[:1] + ["-o", os.path.join(work, "race_a")] + flags[1:],
                             stderr=subprocess.PIPE, text=True, env=e)
    said_a = ""
    for line in first.stderr:
        said_a += line
        if line.startswith("fsdpc: compiling "):
            break
    said_b = run([fsdpc] + flags[:1] + ["-o", os.path.join(work, "race_b")] + flags[1:], env=e, timeout=900).stderr
    said_a += first.stderr.read()
    if first.wait(timeout=900) != 0:
        raise SystemExit("FAILED: the first of two concurrent compiles exited %d:\n%s" % (first.returncode, said_a))
    archs = ("sm_80", "sm_90", "compute_80")
    compiled = sorted(l.split(" for ")[1].split(" compiled in ")[0] for l in said_a.splitlines()
                      if l.startswith("fsdpc: NVRTC: the model's kernels for "))
    waited = sorted(l.split(" for ")[1].split(" into the cache")[0] for l in said_b.splitlines()
                    if l.startswith("fsdpc: NVRTC: another fsdpc is compiling the model's kernels for "))
    # the second waits for each entry it missed at its start (the first may have written some already: a quiet
    # machine compiles the model's program in a tenth of a second)
    missed = [a for a in archs if not re.search(r"from the cache: .*the model's kernels for [^;]*\b%s\b" % a, said_b)]
    total = [l for l in said_b.splitlines() if re.fullmatch(r"fsdpc: NVRTC: %d programs? read from the cache after "
                                                            r"[0-9]+\.[0-9] s waiting for another fsdpc to compile "
                                                            r"them" % len(missed), l)] if missed else [None]
    with open(os.path.join(work, "race_a"), "rb") as fa, open(os.path.join(work, "race_b"), "rb") as fb:
        same = fa.read() == fb.read()
    if compiled != sorted(archs) or waited != sorted(missed) or len(total) != 1 or not same or \
            any(" compiled in " in l for l in said_b.splitlines()):
        raise SystemExit("FAILED: two concurrent compiles should compile the model's program once per arch (the "
                         "first) while the second waits for each and reads it; identical executables (%s). "
                         "First said:\n%s\nsecond said:\n%s" % (same, said_a, said_b))
    print("two concurrent compiles: the first compiled the model's program for %s, the second waited:\n  %s"
          % (", ".join(archs), "\n  ".join(said_b.splitlines())))


def kernel_entries(cache):
    """the kernel cache's entries (KEY.ARCH), not their lock files (KEY.ARCH.lock) nor the object cache's beside
    them (KEY.o: codegen/objcache.c)"""
    return sorted(e for e in os.listdir(cache) if not e.endswith((".o", ".lock")))


def driver_note(stderr):
    """the one driver note of a cuda compile here (no NVIDIA driver: DESIGN.md's CI machines)"""
    notes = [l for l in stderr.splitlines() if "NVIDIA" in l]
    want = ("fsdpc: note: no NVIDIA driver on this machine (libcuda.so.1 does not load): ", " will need an NVIDIA "
            "driver and GPU to run; --target cpu builds an executable that trains here")
    if len(notes) != 1 or not notes[0].startswith(want[0]) or not notes[0].endswith(want[1]):
        raise SystemExit("FAILED: a cuda compile without a driver should say once that the executable needs one, "
                         "got:\n%s" % stderr)
    return notes[0]


def fused_count(c_path):
    """the model's fused kernels, from its step (--emit-c): kc_launch(KC_COUNT + K, ...)"""
    src = open(c_path).read()
    n = len(set(l.split("KC_COUNT + ")[1].split(",")[0] for l in src.splitlines() if "kc_launch(KC_COUNT + " in l))
    if n == 0:
        raise SystemExit("FAILED: %s launches no fused kernel: the model's own program is not exercised" % c_path)
    return n


def check_lines(stderr, cache, compiled, cached, nfused):
    """a compile that misses the cache: the note, then a line saying what NVRTC compiles for which archs
    (compiled: part -> archs), what comes from the cache (cached: part -> archs) and where the cache is, one
    line per program and arch as it is done (in any order; its wall and CPU time), the total"""
    lines = stderr.splitlines()
    note = driver_note(stderr)
    words = {"kernels": "kernels/cuda", "model": "the model's kernels"}
    what = {"kernels": "kernels/cuda's %d kernels", "model": "this model's %d fused kernels" % nfused}
    head = [l for l in lines if l.startswith("fsdpc: compiling ")]
    njob = sum(len(a.split(", ")) for a in compiled.values())
    jobs = [l for l in lines if l.startswith("fsdpc: NVRTC: ") and " program" not in l]
    done = sorted(l.split(" compiled in ")[0] for l in jobs)
    timed = all(re.fullmatch(r"[0-9]+\.[0-9] s \([0-9]+\.[0-9] s of CPU\)", l.split(" compiled in ")[1]) for l in jobs)
    want_done = sorted("fsdpc: NVRTC: %s for %s" % (words[p], a.replace(" (PTX)", ""))
                       for p, archs in compiled.items() for a in archs.split(", "))
    total = [l for l in lines if l.startswith("fsdpc: NVRTC: %d program%s compiled in " % (njob, "s" * (njob > 1)))]
    todo = " and ".join("%s for %s" % (what[p], compiled[p]) for p in ("kernels", "model") if p in compiled)
    kept = " and ".join("%s for %s" % (words[p], cached[p]) for p in ("kernels", "model") if p in cached)
    head_re = "fsdpc: compiling %s with NVRTC " % todo
    tail = ", a program and arch per thread%s; kernel cache: %s" % ("; from the cache: " + kept if kept else "", cache)
    ok = (len(lines) == 3 + njob and lines[0] == note and timed and len(head) == 1 and len(total) == 1
          and lines[-1] == total[0] and done == want_done and total[0].endswith(" s; kept in %s for the next "
                                                                                  "compile" % cache))
    if ok and "kernels" in compiled:  # the library's kernel count: every kernel of kernels.def, more than 100
        n = head[0][len("fsdpc: compiling kernels/cuda's "):].split()[0]
        ok = n.isdigit() and int(n) > 100
        head_re = head_re.replace("%d", n)
    ok = ok and head[0].startswith(head_re) and head[0].endswith(tail)
    if not ok:
        raise SystemExit("FAILED: a cuda compile should print the note, a line saying that it compiles %s and takes "
                         "%s from the cache %s, a line per program and arch and the total, got:\n%s"
                         % (todo, kept or "nothing", cache, stderr))
    print("a compile of %s (from the cache: %s) says:\n  %s" % (head[0][len("fsdpc: compiling "):].split(" with NVRTC")[0],
                                                                kept or "nothing", "\n  ".join(lines)))


def check_driver_detection(fsdpc, work, gpt, gpt_flags, env):
    """no note for --target cpu; where a libcuda.so.1 loads (a stub on LD_LIBRARY_PATH) not the missing driver: the
    missing GPU instead, or nothing where /dev/nvidiactl is there"""
    p = run([fsdpc, gpt, "-o", os.path.join(work, "gpt_cpu"), "--target", "cpu", "--loss",
             "cross_entropy:logits,labels", "--dim", "batch=4"])
    if "NVIDIA" in p.stderr:
        raise SystemExit("FAILED: --target cpu should not mention the NVIDIA driver, got:\n%s" % p.stderr)
    stub = os.path.join(work, "stub")
    os.makedirs(stub, exist_ok=True)
    src = os.path.join(stub, "stub.c")
    open(src, "w").write("int fsdpc_stub_cuda;\n")
    run(["cc", "-shared", "-fPIC", "-o", os.path.join(stub, "libcuda.so.1"), src])
    p = run([fsdpc, gpt, "-o", os.path.join(work, "gpt_stub")] + gpt_flags,
            env=dict(env, LD_LIBRARY_PATH=stub + ":" + os.environ.get("LD_LIBRARY_PATH", "")))
    want = [] if os.path.exists("/dev/nvidiactl") else [
        "fsdpc: note: no NVIDIA GPU on this machine (libcuda.so.1 loads, but there is no /dev/nvidiactl): %s will "
        "need an NVIDIA driver and GPU to run; --target cpu builds an executable that trains here"
        % os.path.join(work, "gpt_stub")]
    if p.stderr.splitlines() != want:
        raise SystemExit("FAILED: with a libcuda.so.1 that loads, expected %s, got:\n%s" % (want, p.stderr))
    print("driver note: once per cuda build, none for --target cpu; with a stub libcuda.so.1: %s" % (want or "none"))


def data_flags(work, name):
    import numpy as np
    rng = np.random.default_rng(0)
    if name == "gpt":
        path = os.path.join(work, "tokens.bin")
        rng.integers(0, 256, 4096).astype("<u2").tofile(path)
        return ["--tokens", path]
    x, y = os.path.join(work, "x.npy"), os.path.join(work, "labels.npy")
    np.save(x, rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    np.save(y, rng.integers(0, 10, 8).astype(np.int64))
    return ["--data", "x=" + x, "--data", "labels=" + y]


def make_f64_mlp(path):
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    w = numpy_helper.from_array(np.ones((3, 2), np.float64), "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "f64",
                          [helper.make_tensor_value_info("x", TensorProto.DOUBLE, ["batch", 3])],
                          [helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["batch", 2])], [w])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def make_3d_model(path, f64):
    """Conv, MaxPool, ConvTranspose, AveragePool and LpPool in 3-D (passes/lift3d.c composes them of 2-D ops)"""
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    import numpy as np
    dt, pt = (np.float64, TensorProto.DOUBLE) if f64 else (np.float32, TensorProto.FLOAT)
    rng = np.random.default_rng(1)
    w = [numpy_helper.from_array(rng.standard_normal(s).astype(dt), n)
         for n, s in (("w1", (4, 1, 3, 3, 3)), ("b1", (4,)), ("w2", (4, 2, 2, 2, 2)))]
    node = helper.make_node
    nodes = [node("Conv", ["x", "w1", "b1"], ["c"], pads=[1] * 6, group=2),
             node("MaxPool", ["c"], ["m"], kernel_shape=[2, 2, 2], strides=[2, 2, 2]),
             node("ConvTranspose", ["m", "w2"], ["t"], strides=[2, 2, 2], group=2),
             node("AveragePool", ["t"], ["a"], kernel_shape=[3, 3, 3], pads=[1] * 6, ceil_mode=1),
             node("LpPool", ["a"], ["y"], kernel_shape=[2, 2, 2], strides=[2, 2, 2])]
    g = helper.make_graph(nodes, "pool3d", [helper.make_tensor_value_info("x", pt, ["batch", 2, 6, 6, 6])],
                          [helper.make_tensor_value_info("y", pt, None)], w)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def check_3d(fsdpc, work, env):
    """8. 3-D convolutions and pooling build for cuda in float32 and float64: the 2-D kernels (forward and
    backward) of their dtype in the step, the no-GPU line at start"""
    for f64 in (False, True):
        sfx = "f64" if f64 else "f32"
        model, exe = os.path.join(work, "conv3d_%s.onnx" % sfx), os.path.join(work, "conv3d_" + sfx)
        make_3d_model(model, f64)
        run([fsdpc, model, "-o", exe, "--target", "cuda", "--arch", "sm_80", "--emit-c", "--loss", "mse:y,target",
             "--dim", "batch=2", "--verify", "--quiet"], env=env)  # one arch: the kernels' choice is the point
        src = open(exe + ".c").read()
        calls = ["k_%s_%s(" % (k, sfx) for k in ("conv2d", "conv2d_grad_w", "conv2d_grad_x", "maxpool2d",
                                                  "maxpool2d_grad")]
        missing = [c for c in calls if c not in src]
        if missing:
            raise SystemExit("FAILED: the 3-D %s step lacks %s" % (sfx, missing))
        p, nogpu = expect_error([exe, "--steps", "1"], "CUDA")
        if len(nogpu) != 1:
            raise SystemExit("FAILED: conv3d_%s without a GPU: expected one line, got:\n%s" % (sfx, p.stderr))
    print("3-D Conv, ConvTranspose, MaxPool, AveragePool, LpPool: built for cuda in float32 and float64")


if __name__ == "__main__":
    main()
