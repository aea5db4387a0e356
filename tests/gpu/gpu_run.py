"""tests/gpu/run.sh run: the cuda executables that prep.py built, on this machine's GPU.

usage: python3 tests/gpu/gpu_run.py OUTDIR      (run.sh sets LD_LIBRARY_PATH first)

1. the device layer's own test (cuda_rt_dev_test: GEMMs, collectives at
   world 1, graph replay, device checks, FSDPC_CUDA_SYNC=1);
2. the check models (GPT, ResNet-18) against their CPU reference losses:
   FSDPC_NO_TF32=1 with and without CUDA Graphs must agree within 1e-4
   (relative, every step); TF32 is reported, not asserted; the GPT with
   --precision bf16 against its own CPU run within the manifest's tol (2e-3),
   and with --precision fp16 (float16 GEMMs, dynamic loss scaling through the
   step parameters of each graph replay) within its tol (1e-3); the float64
   ResNet-18 (float64 kernels, cuBLASLt's FP64 GEMM) within 1e-9; the fp32 GPT
   with --accum 2 under --accum-mode comm and local (two captured graphs)
   within 1e-5 of each other; and with --val-tokens after every step (eager
   validation passes between graph replays): its training losses those of
   the run without, every val_loss finite;
3. the benchmark models with and without CUDA Graphs (TF32, the default;
   the GPT also with --precision bf16), and the benchmark GPT in PyTorch
   eager and torch.compile, each in fp32 (TF32) and with
   torch.autocast(bfloat16);
4. a table: throughput, step time (median of the steps after the first
   two: warm-up and capture), achieved TFLOPS, MFU against the GPU's dense
   TF32 peak (fp32 runs) or BF16 peak (bf16 runs), peak device memory
   against the compile-time plan.
FLOPs per step: GPT 6 x parameters x tokens (attention's T^2 terms not
counted); ResNet 3 x the forward pass's 2 x multiply-adds of every
convolution and linear layer (BatchNorm, ReLU, pooling, additions not
counted).  Writes OUTDIR/report.txt and results.json (and copies them, with
the logs, to $OUT when set) after every stage, the first within a minute of
the start, so that a call cut short still reports.  Exit 1 when a check
failed.
"""
import gzip
import json
import lzma
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
BUDGET = float(os.environ.get("GPU_RUN_BUDGET", "560"))  # seconds for everything
T0 = time.time()
TOL = 1e-4

# dense tensor-core peaks, TFLOPS (NVIDIA's data sheets: half the sparse figure): TF32, BF16
PEAKS = [("H100 PCIe", 378.0, 756.0), ("H100 NVL", 417.5, 835.0), ("H200 NVL", 417.5, 835.0),
         ("GH200", 494.7, 989.4), ("H200", 494.7, 989.4), ("H100", 494.7, 989.4), ("A100", 156.0, 312.0),
         ("L40S", 183.0, 362.0), ("L4", 60.0, 121.0), ("A10", 62.5, 125.0)]


def left():
    return BUDGET - (time.time() - T0)


class Run:
    def __init__(self, out):
        self.out = out
        self.logdir = os.path.join(out, "logs")
        os.makedirs(self.logdir, exist_ok=True)
        self.rows, self.failures, self.notes = [], [], []

    def sh(self, tag, cmd, timeout, env=None):
        """(rc, stdout, stderr); rc 124 on timeout, None when skipped for lack of time"""
        t = min(timeout, left() - 10)
        if t < 15:
            self.notes.append("%s: skipped (out of time)" % tag)
            return None, "", ""
        e = dict(os.environ)
        e.update(env or {})
        print("gpu_run: %s: %s" % (tag, " ".join(cmd)), flush=True)
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=e, timeout=t, cwd=self.out)
            rc, so, se = p.returncode, p.stdout, p.stderr
        except subprocess.TimeoutExpired as x:
            rc = 124
            so = x.stdout.decode() if isinstance(x.stdout, bytes) else (x.stdout or "")
            se = (x.stderr.decode() if isinstance(x.stderr, bytes) else (x.stderr or "")) + "\n[timed out]"
        with open(os.path.join(self.logdir, tag + ".log"), "w") as f:
            f.write("$ %s\n[rc %s]\n--- stdout\n%s\n--- stderr\n%s\n" % (" ".join(cmd), rc, so, se))
        return rc, so, se

    def fail(self, msg):
        print("gpu_run: FAIL " + msg, flush=True)
        self.failures.append(msg)


def gpu_info():
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=30).stdout.strip().splitlines()[0]
        name, mem, drv = [s.strip() for s in q.split(",")]
        return name, mem, drv
    except Exception as x:  # noqa: BLE001 - informational only
        return "unknown GPU (%s)" % x, "?", "?"


def peak_for(name):
    """{"fp32": dense TF32 peak, "bf16": dense BF16 peak, "fp16": the same (FP16 = BF16 on these GPUs)}, or Nones"""
    for key, tf32, bf16 in PEAKS:
        if key in name:
            return {"fp32": tf32, "bf16": bf16, "fp16": bf16}
    return {"fp32": None, "bf16": None, "fp16": None}


def unpack(out, models):
    for exe in [m["exe"] for m in models] + ["cuda_rt_dev_test"]:  # in case the copy lost the mode
        path = os.path.join(out, exe)
        if os.path.exists(path):
            os.chmod(path, 0o755)
    for m in models:
        init = m["init"]
        if init.endswith((".xz", ".gz")):  # prep.py's (.gz: an older package's)
            dst = os.path.join(out, init[:-3])
            if not os.path.exists(dst):
                opener = lzma.open if init.endswith(".xz") else gzip.open
                with opener(os.path.join(out, init), "rb") as f, open(dst + ".tmp", "wb") as g:
                    shutil.copyfileobj(f, g, 1 << 24)
                os.replace(dst + ".tmp", dst)
        gen = m.get("gen")
        rng = np.random.default_rng(0)
        if gen and "tokens" in gen and not os.path.exists(os.path.join(out, m["name"] + ".tokens.bin")):
            rng.integers(0, gen["vocab"], gen["tokens"]).astype("<u2").tofile(os.path.join(out, m["name"] +
                                                                                           ".tokens.bin"))
        if gen and "images" in gen and not os.path.exists(os.path.join(out, m["name"] + "_x.npy")):
            n, s = gen["images"], gen["size"]
            np.save(os.path.join(out, m["name"] + "_x.npy"), rng.standard_normal((n, 3, s, s), dtype=np.float32))
            np.save(os.path.join(out, m["name"] + "_labels.npy"), rng.integers(0, gen["classes"], n).astype(np.int64))


def device_layer(r, report):
    """cuda_rt_dev_test's modes; report() after each (a mode may take up to its 120 s: the first result is
    written after the first mode, not after all eight)"""
    exe = os.path.join(r.out, "cuda_rt_dev_test")
    if not os.path.exists(exe):
        r.notes.append("cuda_rt_dev_test not carried: the device layer's own test did not run")
        return
    for tag, args, env, want in [("nodriver", ["nodriver"], {}, 77), ("graph", ["graph"], {}, 0),
                                 ("eager", ["eager"], {}, 0), ("check", ["check"], {}, 0),
                                 ("sync", ["eager"], {"FSDPC_CUDA_SYNC": "1"}, 0),
                                 ("notf32", ["graph"], {"FSDPC_NO_TF32": "1"}, 0),
                                 ("nccl-graph", ["graph"], {"FSDPC_NCCL_ALWAYS": "1"}, 0),
                                 ("nccl-eager", ["eager"], {"FSDPC_NCCL_ALWAYS": "1"}, 0)]:
        rc, so, se = r.sh("rt_dev_test_" + tag, [exe] + args, 120, env)
        if rc is None:
            continue
        ok = rc == want
        line = (so.strip().splitlines() or [""])[-1]
        r.rows.append(dict(section="device layer", model="cuda_rt_dev_test", run=tag,
                           result="pass" if ok else "FAIL (rc %s)" % rc, detail=line))
        if not ok:
            r.fail("cuda_rt_dev_test %s: exit %s (want %d): %s" % (tag, rc, want, (se.strip() or so.strip())[-500:]))
        report()


def parse_metrics(path):
    losses, times, mem = [], [], None
    if not os.path.exists(path):
        return losses, times, mem
    for line in open(path):
        o = json.loads(line)
        if "memory" in o:
            mem = o["memory"]
        elif "step" in o:
            losses.append(o["loss"])
            times.append(o["time_ms"])
    return losses, times, mem


def parse_meminfo(stdout):
    for line in stdout.splitlines():
        if line.startswith("fsdpc-cuda-mem:"):
            kv = {}
            for tok in line.split()[1:]:
                if "=" in tok:
                    k, v = tok.split("=", 1)
                    kv[k] = v
            return kv
    return None


def run_model(r, m, tag, env, extra, peaks, timeout):
    metrics = os.path.join(r.out, "%s.%s.jsonl" % (m["name"], tag))
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = ["./" + m["exe"]] + m["args"] + ["--steps", str(m["steps"]), "--metrics", metrics, "--quiet"] + extra
    e = {"FSDPC_CUDA_MEMINFO": "1", "FSDPC_STEP_TIMEOUT": "60"}  # a hang ends in a minute, with a message
    e.update(env)
    rc, so, se = r.sh("%s.%s" % (m["name"], tag), cmd, timeout, e)
    if rc is None:
        return None
    losses, times, mem = parse_metrics(metrics)
    if rc != 0 or len(losses) != m["steps"]:
        r.fail("%s %s: exit %s, %d of %d steps: %s" % (m["name"], tag, rc, len(losses), m["steps"],
                                                       (se.strip() or so.strip())[-600:]))
        return None
    steady = times[2:] if len(times) > 3 else times
    ms = statistics.median(steady)
    tflops = m["flops_per_step"] / (ms * 1e-3) / 1e12
    peak = peaks.get(m.get("precision", "fp32"))
    mi = parse_meminfo(so) or {}
    row = dict(section="check" if m["check"] else "benchmark", model=m["name"], run=tag, steps=m["steps"],
               rate=m["items_per_step"] / (ms * 1e-3), unit=m["unit"], step_ms=ms, tflops=tflops,
               mfu=tflops / peak if peak else None, peak_used=int(mi["peak_used"]) if "peak_used" in mi else None,
               context_used=int(mi["context_used"]) if "context_used" in mi else None, plan=m["plan_bytes"],
               rt_total=mem.get("total_bytes") if mem else None, losses=losses)
    if m["check"]:
        ref = m["cpu_losses"]
        rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
        row["max_rel"] = rel
        # bf16 GEMMs never use TF32; an fp32 run is asserted only with TF32 off
        strict = env.get("FSDPC_NO_TF32") == "1" or m.get("precision") in ("bf16", "fp16", "fp64")
        tol = m.get("tol", TOL)
        row["result"] = ("pass" if rel <= tol else "FAIL") if strict else "(TF32: not asserted)"
        if strict and rel > tol:
            worst = max(range(len(ref)), key=lambda i: abs(losses[i] - ref[i]) / abs(ref[i]))
            sens = m.get("cpu_sensitivity") or [None] * len(ref)
            r.fail("%s %s: loss differs from the CPU by %.3g (> %g) at step %d: %.9g vs %.9g (the check's own "
                   "sensitivity there, prep.py's: %s)" % (m["name"], tag, rel, tol, worst + 1, losses[worst],
                                                          ref[worst], sens[worst]))
    r.rows.append(row)
    return row


def accum_modes(r, m):
    """--accum 2 on the fp32 check GPT with --accum-mode comm and local, both replayed as CUDA Graphs (local
    captures two: a micro-step that only sums, and the last): the same losses within 1e-5"""
    got = {}
    for mode in ("comm", "local"):
        metrics = os.path.join(r.out, "%s.accum-%s.jsonl" % (m["name"], mode))
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = ["./" + m["exe"]] + m["args"] + ["--steps", str(m["steps"]), "--accum", "2", "--accum-mode", mode,
                                               "--metrics", metrics, "--quiet"]
        rc, so, se = r.sh("%s.accum-%s" % (m["name"], mode), cmd, 90, {"FSDPC_NO_TF32": "1", "FSDPC_STEP_TIMEOUT": "60"})
        if rc is None:
            return
        losses = parse_metrics(metrics)[0]
        if rc != 0 or len(losses) != m["steps"]:
            r.fail("%s --accum 2 --accum-mode %s: exit %s, %d of %d steps: %s" % (
                m["name"], mode, rc, len(losses), m["steps"], (se.strip() or so.strip())[-600:]))
            return
        got[mode] = losses
    rel = max(abs(a - b) / abs(b) for a, b in zip(got["local"], got["comm"]))
    r.notes.append("%s --accum 2: --accum-mode local's losses within %.3g of comm's" % (m["name"], rel))
    if rel > 1e-5:
        r.fail("%s --accum 2: --accum-mode local's losses differ from comm's by %.3g (> 1e-5)" % (m["name"], rel))


def validation(r, m):
    """--val-tokens after every step on the fp32 check GPT replayed as CUDA Graphs (validation passes run
    eagerly between the replays): the training losses those of the run without validation within 1e-6, and
    every step's val_loss finite"""
    runs = {}
    for tag, extra in (("plain", []), ("val", ["--val-tokens", m["args"][m["args"].index("--tokens") + 1],
                                                "--eval-every", "1", "--eval-steps", "2"])):
        metrics = os.path.join(r.out, "%s.validation-%s.jsonl" % (m["name"], tag))
        if os.path.exists(metrics):
            os.remove(metrics)
        cmd = ["./" + m["exe"]] + m["args"] + ["--steps", str(m["steps"]), "--metrics", metrics, "--quiet"] + extra
        rc, so, se = r.sh("%s.validation-%s" % (m["name"], tag), cmd, 90,
                          {"FSDPC_NO_TF32": "1", "FSDPC_STEP_TIMEOUT": "60"})
        if rc is None:
            return
        recs = [json.loads(l) for l in open(metrics) if '"step"' in l] if os.path.exists(metrics) else []
        if rc != 0 or len(recs) != m["steps"]:
            r.fail("%s validation %s: exit %s, %d of %d steps: %s" % (m["name"], tag, rc, len(recs), m["steps"],
                                                                      (se.strip() or so.strip())[-600:]))
            return
        runs[tag] = recs
    rel = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(runs["val"], runs["plain"]))
    vals = [o.get("val_loss") for o in runs["val"]]
    r.notes.append("%s with validation after every step: training losses within %.3g of the run without; "
                   "val_loss %s" % (m["name"], rel, ", ".join("%.5f" % v for v in vals if v is not None)))
    if rel > 1e-6 or not all(v is not None and math.isfinite(v) for v in vals):
        r.fail("%s validation: training losses differ by %.3g from the run without, or a val_loss is missing "
               "or not finite: %s" % (m["name"], rel, vals))


def torch_bench(r, manifest_path, peaks, models):
    m = next((x for x in models if x["name"] == "gpt_bench"), None)
    if m is None:
        return
    rc, so, se = r.sh("torch_gpt_bench", [sys.executable, os.path.join(HERE, "torch_gpt_bench.py"), manifest_path,
                                          "--steps", "10", "--modes", "eager,eager bf16,compile,compile bf16"], 400)
    if rc is None:
        return
    if rc != 0:
        last = [l for l in (se.strip() or so.strip()).splitlines() if l.strip()][-1:] or [""]
        r.notes.append("torch_gpt_bench: exit %s: %s (logs/torch_gpt_bench.log)" % (rc, last[0][-300:]))
    for line in so.splitlines():
        if not line.startswith("{"):
            continue
        o = json.loads(line)
        ms = o["step_ms"]
        tflops = m["flops_per_step"] / (ms * 1e-3) / 1e12
        peak = peaks["bf16" if o["mode"].endswith("bf16") else "fp32"]
        r.rows.append(dict(section="benchmark", model="gpt_bench", run=o["mode"], steps=o["steps"],
                           rate=o["items_per_step"] / (ms * 1e-3), unit="tokens", step_ms=ms, tflops=tflops,
                           mfu=tflops / peak if peak else None, peak_used=o["peak_reserved"],
                           context_used=None, plan=None, torch_alloc=o["peak_allocated"],
                           compile_s=o.get("compile_s")))


def gib(b):
    return "%.2f" % (b / 2**30) if b is not None else "-"


def table(r, gpu, peaks):
    fmt = lambda p: "%.1f" % p if p else "unknown"
    lines = ["GPU: %s (%s, driver %s); dense peaks: TF32 %s, BF16 %s TFLOPS (MFU of an fp32 run against TF32, "
             "of a bf16 run against BF16)" % (gpu[0], gpu[1], gpu[2], fmt(peaks["fp32"]), fmt(peaks["bf16"]))]
    hdr = "%-16s %-22s %5s %14s %9s %8s %6s %14s %9s  %s" % ("model", "run", "steps", "throughput", "step ms",
                                                              "TFLOPS", "MFU", "peak GiB (ctx)", "plan GiB",
                                                              "vs CPU")
    lines += [hdr, "-" * len(hdr)]
    for w in r.rows:
        if w["section"] == "device layer":
            lines.append("%-16s %-22s %s  %s" % (w["model"][:16], w["run"], w["result"], w["detail"][:90]))
            continue
        rate = "%.0f %s/s" % (w["rate"], "tok" if w["unit"] == "tokens" else "img")
        peak_s = gib(w["peak_used"]) + (" (%s)" % gib(w["context_used"]) if w.get("context_used") else "")
        if w.get("torch_alloc") is not None:
            peak_s = "%s alloc %s" % (gib(w["peak_used"]), gib(w["torch_alloc"]))
        vs = ""
        if "max_rel" in w:
            vs = "%s max rel %.2e" % (w["result"], w["max_rel"])
        elif w.get("compile_s"):
            vs = "(compile+warm-up %.0f s)" % w["compile_s"]
        lines.append("%-16s %-22s %5d %14s %9.2f %8.2f %6s %14s %9s  %s" % (
            w["model"], w["run"], w["steps"], rate, w["step_ms"], w["tflops"],
            "%.1f%%" % (100 * w["mfu"]) if w["mfu"] is not None else "-", peak_s, gib(w["plan"]), vs))
    lines.append("FLOPs: GPT 6 x params x tokens (no attention T^2 term); ResNet 3 x forward (2 x conv/linear "
                 "multiply-adds). Peak: cudaMemGetInfo's used bytes (whole device, CUDA context included; "
                 "'ctx' = before fsdpc's allocations); PyTorch: max reserved, and allocated. Plan: fsdpc --report.")
    for n in r.notes:
        lines.append("note: " + n)
    lines.append("RESULT: %s" % ("PASS" if not r.failures else "FAIL (%d): %s" % (len(r.failures),
                                                                                "; ".join(r.failures))))
    return "\n".join(lines)


def deliver(r, files, logs):
    """files ({name: text}) into OUTDIR and, when set, $OUT, with the logs tarred there as logs; each written
    whole (a temporary, then renamed), so that a call cut short brings back complete files"""
    for d in (r.out, os.environ.get("OUT")):
        if not d or not os.path.isdir(d):
            continue
        for name, body in files.items():
            with open(os.path.join(d, name + ".tmp"), "w") as f:
                f.write(body)
            os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
        if d != r.out:
            with tarfile.open(os.path.join(d, logs + ".tmp"), "w:gz") as t:
                t.add(r.logdir, arcname="logs")
            os.replace(os.path.join(d, logs + ".tmp"), os.path.join(d, logs))


def publish(r, gpu, peaks, done):
    """report.txt and results.json (and logs.tar.gz in $OUT) after every stage, so that a call cut short still
    brings back what ran (done False: the table says the run goes on)"""
    text = table(r, gpu, peaks)
    if not done:
        text += "\n(partial: written at %.0f s, the run went on)" % (time.time() - T0)
    deliver(r, {"report.txt": text + "\n",
                "results.json": json.dumps(dict(gpu=gpu, peaks=peaks, rows=r.rows, failures=r.failures,
                                                notes=r.notes, done=done), indent=1)}, "logs.tar.gz")
    return text


def main():
    out = os.path.abspath(sys.argv[1])
    manifest_path = os.path.join(out, "manifest.json")
    models = json.load(open(manifest_path))["models"]
    r = Run(out)
    gpu = gpu_info()
    peaks = peak_for(gpu[0])
    print("gpu_run: %s; %d models; budget %.0f s" % (gpu[0], len(models), BUDGET), flush=True)
    unpack(out, models)
    publish(r, gpu, peaks, False)  # the GPU and the plan, before anything runs
    device_layer(r, lambda: publish(r, gpu, peaks, False))
    for m in models:
        if m["check"] and m.get("precision") in ("bf16", "fp16", "fp64"):
            run_model(r, m, m["precision"] + "-graph", {}, [], peaks, 90)
            run_model(r, m, m["precision"] + "-eager", {}, ["--no-cuda-graph"], peaks, 90)
        elif m["check"]:
            run_model(r, m, "fp32-graph", {"FSDPC_NO_TF32": "1"}, [], peaks, 90)
            run_model(r, m, "fp32-eager", {"FSDPC_NO_TF32": "1"}, ["--no-cuda-graph"], peaks, 90)
            run_model(r, m, "tf32-graph", {}, [], peaks, 90)
            if m["kind"] == "gpt":
                accum_modes(r, m)
                validation(r, m)
        publish(r, gpu, peaks, False)
    for m in models:
        if not m["check"]:
            p = "bf16" if m.get("precision") == "bf16" else "tf32"
            run_model(r, m, p + "-graph", {}, [], peaks, 180)
            run_model(r, m, p + "-eager", {}, ["--no-cuda-graph"], peaks, 180)
            publish(r, gpu, peaks, False)
    torch_bench(r, manifest_path, peaks, models)
    print(publish(r, gpu, peaks, True), flush=True)
    print("gpu_run: %.0f s" % (time.time() - T0))
    sys.exit(1 if r.failures else 0)


if __name__ == "__main__":
    main()
