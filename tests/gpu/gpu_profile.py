"""tests/gpu/run.sh profile: where the cuda executables' time goes, on this machine's GPU.

usage: python3 tests/gpu/gpu_profile.py OUTDIR      (run.sh sets LD_LIBRARY_PATH first)

1. every benchmark model (prep.py's, not the checks) for two eager steps
   (--no-cuda-graph) under Nsight Compute, one metric (gpu__time_duration.sum:
   one pass, no replay): the kernels' time per step summed by kernel, largest
   first, beside the step time of an unprofiled run of the same executable;
2. compute-sanitizer's memcheck of every check model, two eager steps: exit 0
   and "0 errors" or a failure;
3. PyTorch's torchvision ResNet-18 on the benchmark ResNet's shape (float32
   with TF32, SGD with momentum, eager and channels-last), beside fsdpc's.
Writes OUTDIR/profile.txt and profile.json (and copies them, with the logs, to
$OUT when set).  Exit 1 when memcheck found an error or a run failed.
"""
import csv
import glob
import io
import json
import os
import shutil
import statistics
import sys
import time

import gpu_run

RESNET_TORCH = r'''
import json, statistics, sys, time, torch, torchvision
B, S, C, steps, cl = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.cudnn.benchmark = True
m = torchvision.models.resnet18(num_classes=C).cuda()
fmt = torch.channels_last if cl else torch.contiguous_format
m = m.to(memory_format=fmt)
opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
x = torch.randn(B, 3, S, S, device="cuda").to(memory_format=fmt)
y = torch.randint(0, C, (B,), device="cuda")
ts = []
for i in range(steps):
    torch.cuda.synchronize()
    t = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    loss.item()
    ts.append((time.perf_counter() - t) * 1e3)
print(json.dumps({"step_ms": statistics.median(ts[3:]), "peak_reserved": torch.cuda.max_memory_reserved()}))
'''


def find_tool(name):
    p = shutil.which(name)
    if p:
        return p
    for pat in ["/usr/local/cuda/bin/" + name, "/opt/nvidia/nsight-compute/*/" + name,
                "/usr/local/cuda/nsight-compute*/" + name]:
        hits = sorted(glob.glob(pat))
        if hits:
            return hits[-1]
    return None


def kernel_times(text):
    """{kernel: [calls, ns]} from ncu --csv --page details --print-units base output"""
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if start is None:
        return None
    agg = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        v *= {"nsecond": 1, "ns": 1, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6, "second": 1e9}.get(unit, 1)
        a = agg.setdefault(row["Kernel Name"], [0, 0.0])
        a[0] += 1
        a[1] += v
    return agg


def plain_step(r, m):
    """the median eager step (ms) of 5 steps without the profiler, or None"""
    metrics = os.path.join(r.out, m["name"] + ".plain.jsonl")
    rc, so, se = r.sh(m["name"] + ".plain", ["./" + m["exe"]] + m["args"] + ["--no-cuda-graph", "--quiet", "--steps",
                                                                             "5", "--metrics", metrics], 120,
                      {"FSDPC_STEP_TIMEOUT": "300"})
    if rc != 0:
        r.fail("%s: exit %s: %s" % (m["name"], rc, (se.strip() or so.strip())[-400:]))
        return None
    _, times, _ = gpu_run.parse_metrics(metrics)
    return statistics.median(times[2:]) if len(times) > 2 else None


def profile_model(r, m, ncu, steps, step_ms, lines, out):
    base = ["./" + m["exe"]] + m["args"] + ["--no-cuda-graph", "--quiet"]
    e = {"FSDPC_STEP_TIMEOUT": "300"}
    cmd = [ncu, "--csv", "--page", "details", "--print-units", "base", "--metrics", "gpu__time_duration.sum",
           "--cache-control", "none", "--clock-control", "none", "--print-kernel-base", "function"] + base + \
        ["--steps", str(steps)]
    rc, so, se = r.sh(m["name"] + ".ncu", cmd, 240, e)
    agg = kernel_times(so) if rc == 0 else None
    if not agg:
        r.fail("%s: ncu gave no kernel times (exit %s): %s" % (m["name"], rc, (se.strip() or so.strip())[-400:]))
        return
    total = sum(v[1] for v in agg.values()) / steps
    lines.append("")
    lines.append("%s (%s, eager): kernels %.2f ms per step (sum of durations, %d launches); unprofiled step %s ms"
                 % (m["name"], m.get("precision", "fp32"), total / 1e6, sum(v[0] for v in agg.values()) // steps,
                    "%.2f" % step_ms if step_ms else "?"))
    lines.append("  %-70s %8s %10s %6s" % ("kernel", "calls", "ms/step", "%"))
    rows = sorted(agg.items(), key=lambda kv: -kv[1][1])
    for name, (calls, ns) in rows[:25]:
        lines.append("  %-70s %8d %10.3f %5.1f%%" % (name[:70], calls // steps, ns / steps / 1e6, 100 * ns / steps / total))
    rest = rows[25:]
    if rest:
        ns = sum(v[1] for _, v in rest) / steps
        lines.append("  %-70s %8d %10.3f %5.1f%%" % ("(%d more kernels)" % len(rest), sum(v[0] for _, v in rest) // steps,
                                                     ns / 1e6, 100 * ns / total))
    out[m["name"]] = dict(step_ms=step_ms, kernel_ms=total / 1e6,
                          kernels={k: [v[0] / steps, v[1] / steps / 1e6] for k, v in agg.items()})


def memcheck(r, m, cs, lines, out):
    cmd = [cs, "--tool", "memcheck", "--leak-check", "no", "--error-exitcode", "3"] + \
        ["./" + m["exe"]] + m["args"] + ["--steps", "2", "--no-cuda-graph", "--quiet"]
    rc, so, se = r.sh(m["name"] + ".memcheck", cmd, 240, {"FSDPC_STEP_TIMEOUT": "300"})
    if rc is None:
        return
    summary = [l for l in (so + se).splitlines() if "ERROR SUMMARY" in l]
    ok = rc == 0 and summary and " 0 errors" in summary[-1]
    lines.append("memcheck %-20s exit %s: %s" % (m["name"], rc, summary[-1].strip() if summary else "(no summary)"))
    out["memcheck " + m["name"]] = dict(rc=rc, summary=summary[-1] if summary else None)
    if not ok:
        r.fail("memcheck %s: exit %s: %s" % (m["name"], rc, "\n".join((so + se).splitlines()[-30:])))


def torch_resnet(r, m, lines, out):
    py = sys.executable
    B, S, C = m["batch"], m["config"]["size"], m["config"]["classes"]
    for cl in ("0", "1"):
        tag = "torch_resnet" + ("_cl" if cl == "1" else "")
        rc, so, se = r.sh(tag, [py, "-c", RESNET_TORCH, str(B), str(S), str(C), "12", cl], 180)
        if rc != 0:
            r.notes.append("%s: exit %s: %s" % (tag, rc, se.strip()[-300:]))
            continue
        res = json.loads(so.strip().splitlines()[-1])
        out[tag] = res
        lines.append("PyTorch ResNet-18 %s, batch %d at %dx%d, TF32, eager: %.2f ms per step (%.0f img/s), "
                     "peak reserved %.2f GiB" % ("channels-last" if cl == "1" else "NCHW", B, S, S, res["step_ms"],
                                                  B / res["step_ms"] * 1e3, res["peak_reserved"] / 2**30))


def main():
    out_dir = os.path.abspath(sys.argv[1])
    models = json.load(open(os.path.join(out_dir, "manifest.json")))["models"]
    r = gpu_run.Run(out_dir)
    gpu = gpu_run.gpu_info()
    gpu_run.unpack(out_dir, models)
    lines = ["GPU: %s (%s, driver %s)" % gpu]
    res = {}
    ncu, cs = find_tool("ncu"), find_tool("compute-sanitizer")
    lines.append("ncu: %s; compute-sanitizer: %s" % (ncu, cs))
    bench = [m for m in models if not m["check"]]
    plain = {m["name"]: plain_step(r, m) for m in bench}  # first: a cut-short call still has the step times
    for m in bench:
        lines.append("%s (%s): eager step %s ms without the profiler" % (m["name"], m.get("precision", "fp32"),
                                                                          "%.2f" % plain[m["name"]] if plain[m["name"]] else "?"))
        print(lines[-1], flush=True)
    if ncu:
        for m in bench:
            profile_model(r, m, ncu, 2, plain[m["name"]], lines, res)
    else:
        r.fail("ncu not found")
    for m in models:
        if m["kind"] == "resnet" and not m["check"]:
            torch_resnet(r, m, lines, res)
    lines.append("")
    if cs:
        for m in models:
            if m["check"]:
                memcheck(r, m, cs, lines, res)
    else:
        r.fail("compute-sanitizer not found")
    lines += ["note: " + n for n in r.notes]
    lines.append("RESULT: " + ("FAIL (%d): %s" % (len(r.failures), "; ".join(f[:300] for f in r.failures))
                               if r.failures else "pass"))
    text = "\n".join(lines)
    print(text, flush=True)
    gpu_run.deliver(r, {"profile.txt": text + "\n",
                        "profile.json": json.dumps(dict(gpu=gpu, results=res, failures=r.failures, notes=r.notes),
                                                   indent=1)}, "profile_logs.tar.gz")
    print("gpu_profile: %.0f s" % (time.time() - gpu_run.T0))
    sys.exit(1 if r.failures else 0)


if __name__ == "__main__":
    main()
