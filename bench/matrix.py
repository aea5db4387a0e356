"""The benchmark matrix (issue 32 item 6): fsdpc against PyTorch 2 on a GPT, a BERT-style encoder, ResNet-18 and
ResNet-50, fp32 and bf16, at 1 thread (CPU time per step), 2 threads and 2 ranks (wall time per step), quiet and
beside a competing busy process; a JSON of every figure, and the markdown tables of README/docs made from it.

    python3 bench/matrix.py [--quick] [--models M,...] [--precisions fp32,bf16] [--configs 1t,2t,2r]
                            [--steps 5] [--repeat 1] [--fsdpc build/fsdpc] [--torch2 PYTHON|none] [--cores 0,1]
                            [--json matrix.json] [--keep]
    python3 bench/matrix.py --table matrix.json ...    the markdown tables (stdout) from runs' JSON files

Run it with the python3 that has PyTorch 2 and torchvision (here pyenv's, torch 2.15): it exports every model with
that torch (bench/models.py: the TorchScript exporter, training mode) and runs the PyTorch sides under it
(bench/torch2.py finds one; --torch2 none leaves PyTorch out, the fsdpc columns alone).  Models (bench/models.py's
names; default gpt:256/6/256/8, bert:256/6/128/8, resnet18:112/8, resnet50:224/2 — ResNet-50 at 224² is slow here:
batch 2 and, with --steps, as few steps as the others).  --quick: gpt:128/2/64/4, bert:128/2/64/4, resnet18:32/4,
2 timed steps, fp32 and bf16: a few minutes, to see that everything runs.

The configurations, every thread count set explicitly (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS,
torch.set_num_threads, mpirun -x), each run pinned with taskset to the first of --cores (1 thread) or both:
  1t  one process, 1 thread: CPU time per step (user + system of all its threads over the timed steps / steps,
      after one warm-up step; fsdpc: /proc schedstat, PyTorch: CLOCK_PROCESS_CPUTIME_ID), the figure a shared
      machine's load distorts least.  Sides: fsdpc, PyTorch eager, torch.compile.  Quiet only.
  2t  one process, 2 threads: wall time per step (median of the timed steps), quiet and beside one busy process
      (`while :; do :; done` pinned to the first core: gpt_work.competitor).  fsdpc, eager, torch.compile.
  2r  2 ranks x 1 thread: fsdpc under mpirun -np 2 (each rank half the batch) against PyTorch DDP over gloo; wall
      time per step (the slowest rank's), quiet and busy.
bf16: fsdpc --precision bf16, PyTorch the forward and loss under torch.autocast("cpu", torch.bfloat16)
(bench/torch_step.py).  Interleaved: each repetition runs, per model, precision and configuration, every side in
turn (quiet, then busy), so a slow minute of the machine hits all sides.  The runs themselves are
bench/gpt_work.py's (run_fsdpc, run_torch).  The GPT's GEMM share: 5 fp32 (and bf16) 1-thread steps of fsdpc's GPT
under --trace, each node's shortest time after the first step, the share of that time spent in GEMM nodes (MatMul,
Gemm, MatMulAdd: a GEMM with its fused bias or residual epilogue; the fused attention apart).

The JSON holds the machine (lscpu's model, the AVX512-BF16 flag, OPENBLAS_CORETYPE), the date, the load average at
the start, after each repetition and at the end, the versions (fsdpc, its git commit, torch, torchvision, Open MPI)
and every run: model, precision, config, busy, side, wall ms per step, CPU ms per step, peak RSS, the losses, the
load average then.  Wall-clock figures are only as good as the machine was quiet: the tables print the load beside
them.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt_work  # noqa: E402
import models  # noqa: E402
from torch2 import torch2_python  # noqa: E402

DEFAULT = "gpt:256/6/256/8,bert:256/6/128/8,resnet18:112/8,resnet50:224/2"
QUICK = "gpt:128/2/64/4,bert:128/2/64/4,resnet18:32/4"
CONFIGS = {"1t": (1, 1), "2t": (2, 1), "2r": (1, 2)}  # (threads, ranks)
# issue 32's targets the tables show against: CPU time per step at 1 thread, fsdpc / torch.compile
TARGETS = {"gpt": 0.85, "bert": 0.9, "resnet18": 0.8}
BUSY_TARGET = 2.5  # busy / quiet step at 2 threads or 2 ranks
GEMM_TARGET = 0.8  # the GPT step's GEMM share
GEMM_OPS = ("MatMul", "MatMulAdd", "Gemm")  # the trace's GEMM nodes (MatMulAdd: a GEMM with its fused epilogue)


def load():
    return float(open("/proc/loadavg").read().split()[0])


def sides(config, torch_py):
    if torch_py is None:
        return ["fsdpc"]
    return ["fsdpc", "ddp"] if config == "2r" else ["fsdpc", "eager", "compile"]


def exe_name(precision, ranks):
    return "train%d_%s" % (ranks, precision)


def one_run(work, side, precision, config, busy, a, torch_py):
    """one run of side: its record (the JSON's 'runs' entry)"""
    threads, ranks = CONFIGS[config]
    cores = a.cores.split(",")
    prefix = ["taskset", "-c", ",".join(cores[:max(threads, ranks)])]
    with gpt_work.competitor(cores[0] if busy else None):
        if side == "fsdpc":
            r = gpt_work.run_fsdpc(work, exe_name(precision, ranks), a.steps + 1, threads, ranks, prefix=prefix)
            cpu, whole = r["cpu_step_s"], r["cpu_step_s"] is None
            if whole:  # steps too short to sample (a tiny model): the whole run's CPU time over its steps
                cpu = r["cpu_run_s"] / (a.steps + 1)
        else:
            r = gpt_work.run_torch(torch_py, work, side, threads, a.steps, precision=precision, ranks=ranks,
                                   prefix=prefix)
            cpu, whole = sum(r["cpu_s"][1:]) / len(r["cpu_s"][1:]), False
    return dict(wall_ms=statistics.median(r["times_ms"][1:]), cpu_ms=cpu * 1e3 if cpu is not None else None,
                cpu_whole_run=whole, peak_rss_mb=r["peak_rss"] / 2**20, losses=r["losses"], load=load())


def gemm_share(work, precision, a):
    """trace_shares of 5 traced 1-thread steps of fsdpc's model in work, and where perf is installed perf_shares of
    12 steps, and of the 10 steps alone (a run of 2 steps subtracted: its start-up and first steps)"""
    exe = os.path.join(work, exe_name(precision, 1))
    cmd = ["taskset", "-c", a.cores.split(",")[0], exe, "--data", "input_ids=" + os.path.join(work, "idx.npy"),
           "--data", "labels=" + os.path.join(work, "lab.npy"), "--quiet"]
    trace = os.path.join(work, "trace_%s.json" % precision)
    subprocess.run(cmd + ["--steps", "5", "--trace", trace, "--trace-steps", "5"], env=gpt_work.thread_env(1),
                   check=True, stdout=subprocess.DEVNULL)
    out = trace_shares(trace)
    if shutil.which("perf"):
        long = perf_samples(cmd + ["--steps", "12"], os.path.join(work, "perf_%s.data" % precision))
        short = perf_samples(cmd + ["--steps", "2"], os.path.join(work, "perf2_%s.data" % precision))
        if long:
            out["perf"] = perf_shares(long, os.path.basename(exe))
        if long and short:
            steps = {k: n - short.get(k, 0) for k, n in long.items()}
            out["perf_steps"] = perf_shares({k: n for k, n in steps.items() if n > 0}, os.path.basename(exe))
    return out


def perf_samples(cmd, data):
    """{(dso, symbol): samples} of cmd's run (perf record, 999 Hz; CPU time, so the machine's load does not shift
    the shares as it does the trace's wall-clock times); None when perf cannot record here"""
    p = subprocess.run(["perf", "record", "-q", "-F", "999", "-o", data, "--"] + cmd, env=gpt_work.thread_env(1),
                       capture_output=True)
    if p.returncode != 0:
        return None
    rep = subprocess.run(["perf", "report", "-i", data, "-n", "--sort", "dso,sym", "--stdio"], capture_output=True,
                         text=True).stdout
    out = {}
    for line in rep.splitlines():
        f = line.split()
        if len(f) >= 4 and f[0].endswith("%") and f[1].isdigit() and not line.startswith("#"):
            dso = " ".join(f[2:4]) if f[2] == "[JIT]" else f[2]
            key = (dso, f[-1])
            out[key] = out.get(key, 0) + int(f[1])
    return out


def perf_shares(samples, exe):
    """the shares of the samples in GEMM code (OpenBLAS, oneDNN's library and its JIT-generated kernels: perf's
    "[JIT]"), in the executable's own code (exe), in libm/libmvec and in the kernel, and the largest symbols"""
    total = sum(samples.values())
    rows = sorted(((n / total, dso, sym) for (dso, sym), n in samples.items()), reverse=True)

    def share(pred):
        return sum(x for x, dso, _ in rows if pred(dso))

    gemm = ("libopenblas", "[JIT]", "libdnnl", "libmkl")
    return dict(gemm=share(lambda d: d.startswith(gemm)), own=share(lambda d: d == exe),
                libm=share(lambda d: d.startswith(("libm.", "libmvec"))), kernel=share(lambda d: d.startswith("[k")),
                top=[("%s %s" % (dso.split(".so")[0], sym), x) for x, dso, sym in rows[:6]])


def trace_shares(trace):
    """the shares of a traced step's node time (rank 0, the step's thread) in GEMM nodes (GEMM_OPS), in the fused
    attention, and per op; each node's time is its shortest over the traced steps but the first (a node the
    machine's other users preempted in one step is not charged for it: the trace's durations are wall-clock)"""
    ev = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X" and e.get("tid") == 0
          and e["args"]["step"] > 1]
    best = {}
    for e in ev:
        best[e["name"]] = min(best.get(e["name"], e["dur"]), e["dur"])
    total = sum(best.values())

    def share(pred):
        return sum(d for n, d in best.items() if pred(op_of(n))) / total

    return dict(step_ms=total / 1e3, gemm=share(lambda op: op in GEMM_OPS),
                attention=share(lambda op: "ttention" in op),
                by_op=sorted(((op, share(lambda o, op=op: o == op)) for op in {op_of(n) for n in best}),
                             key=lambda t: -t[1])[:12])


def op_of(name):
    """the op of a trace event's name, "NODE (OP)" """
    return name.rsplit(" (", 1)[-1].rstrip(")")


def versions(fsdpc, torch_py):
    def out(cmd):
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=HERE).stdout.strip()
        except OSError:
            return ""
    v = dict(fsdpc=out([fsdpc, "--version"]).split("\n")[0], commit=out(["git", "rev-parse", "--short", "HEAD"]),
             python=platform.python_version(), mpirun=out(["mpirun", "--version"]).split("\n")[0])
    if torch_py:
        v["torch"] = out([torch_py, "-c", "import torch, torchvision; print(torch.__version__, "
                                          "torchvision.__version__)"])
    return v


def machine():
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in lscpu.splitlines() if l.startswith("Model name")), "?")
    flags = open("/proc/cpuinfo").read()
    return dict(cpu=model, cpus=os.cpu_count(), avx512_bf16="avx512_bf16" in flags,
                openblas_coretype=os.environ.get("OPENBLAS_CORETYPE", "(unset: OpenBLAS's own choice)"))


def run(a):
    torch_py, _ = torch2_python(a.torch2)
    names = (a.models or (QUICK if a.quick else DEFAULT)).split(",")
    precisions, configs = a.precisions.split(","), a.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            raise SystemExit("bench: --configs %s: of 1t, 2t, 2r" % c)
    for p in precisions:
        if p not in ("fp32", "bf16"):
            raise SystemExit("bench: --precisions %s: of fp32, bf16" % p)
    res = dict(machine=machine(), date=datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"),
               versions=versions(a.fsdpc, torch_py), steps=a.steps, repeat=a.repeat, cores=a.cores,
               command=" ".join(sys.argv), load={"start": load()}, models={}, runs=[], gemm_share={})
    print("load at the start: %.2f" % load(), flush=True)
    root = tempfile.mkdtemp(prefix="fsdpc-matrix-")
    works = {}
    for name in names:
        work = works[name] = os.path.join(root, name.replace(":", "_").replace("/", "-"))
        params = gpt_work.prepare_model(work, name)
        res["models"][name] = dict(params=params)
        B = models.batch(name)
        for p in precisions:
            for ranks in sorted({CONFIGS[c][1] for c in configs}):
                if B % ranks:
                    raise SystemExit("bench: %s: batch %d does not split over %d ranks" % (name, B, ranks))
                gpt_work.build(a.fsdpc, work, exe_name(p, ranks), B // ranks, ["--precision", p])
        print("%s: %d parameters, exported and compiled" % (name, params), flush=True)
    for rep in range(a.repeat):
        for name in names:
            for p in precisions:
                for c in configs:
                    for busy in ((0,) if c == "1t" else (0, 1)):
                        for side in sides(c, torch_py):
                            r = one_run(works[name], side, p, c, busy, a, torch_py)
                            r.update(model=name, precision=p, config=c, busy=busy, side=side, rep=rep)
                            res["runs"].append(r)
                            json.dump(res, open(a.json, "w"), indent=1)  # so far: an interrupted run keeps its runs
                            print("  %s %s %s %s %s: %.1f ms wall, %s ms CPU per step (load %.2f)" % (
                                name, p, c, "busy" if busy else "quiet", side, r["wall_ms"],
                                "%.1f" % r["cpu_ms"] if r["cpu_ms"] is not None else "?", r["load"]), flush=True)
        res["load"]["rep%d" % (rep + 1)] = load()
        print("repetition %d of %d done, load %.2f" % (rep + 1, a.repeat, load()), flush=True)
    for name in names:
        if name.startswith("gpt:") and "1t" in configs:
            res["gemm_share"][name] = {p: gemm_share(works[name], p, a) for p in precisions}
    res["load"]["end"] = load()
    json.dump(res, open(a.json, "w"), indent=1)
    if a.keep:
        print("the work folders (models, executables, traces): %s" % root)
    else:
        shutil.rmtree(root)
    print("wrote %s (python3 bench/matrix.py --table %s: its tables)" % (a.json, a.json))
    print(table(res))


def med(runs, key):
    v = [r[key] for r in runs if r[key] is not None]
    return statistics.median(v) if v else None


def fmt(x, f="%.1f"):
    return f % x if x is not None else "?"


def table(res):
    """the markdown of a run's JSON: the machine, the 1-thread CPU table, the wall-clock table, the GEMM share"""
    m, v = res["machine"], res["versions"]
    loads = ", ".join("%s %.2f" % kv for kv in res["load"].items())
    out = ["Measured %s on %s (%d CPUs%s), OpenBLAS core type %s; %s (%s), %s, torch + torchvision %s; "
           "%d timed steps after a warm-up, %d interleaved repetition(s) (the median); load average (1 min): %s; "
           "`%s`." % (res["date"], m["cpu"], m["cpus"], ", AVX512-BF16" if m["avx512_bf16"] else "",
                      m["openblas_coretype"], v.get("fsdpc"), v.get("commit"), v.get("mpirun"), v.get("torch"),
                      res["steps"], res["repeat"], loads, res["command"]), ""]
    groups = {}
    for r in res["runs"]:
        groups.setdefault((r["model"], r["precision"], r["config"], r["busy"], r["side"]), []).append(r)
    names = list(res["models"])
    precisions = sorted({r["precision"] for r in res["runs"]}, key=["fp32", "bf16"].index)

    def g(name, p, c, busy, side, key):
        return med(groups.get((name, p, c, busy, side), []), key)

    def ratio(x, y):
        return "%.2f" % (x / y) if x is not None and y else "–"

    def loss_gap(name, p):
        """the largest relative difference of the first step's loss between the sides (every configuration)"""
        l0 = [r["losses"][0] for r in res["runs"] if r["model"] == name and r["precision"] == p and r["losses"]]
        return (max(l0) - min(l0)) / abs(min(l0)) if l0 else None

    cpu_head = ["**1 process × 1 thread, CPU ms per step** (user + system of all the process's threads / steps; "
            "target: fsdpc / torch.compile ≤ %s):" % ", ".join("%s %.2f" % kv for kv in TARGETS.items()), "",
            "| model | params | precision | fsdpc | eager | torch.compile | fsdpc / eager | fsdpc / compile | "
            "target | peak RSS fsdpc / eager / compile (MB) | step-1 losses agree to |",
            "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | --- | --- | ---: |"]
    star = "(* the steps too short to sample: the whole run's CPU time, start-up included, over its steps)"
    cpu_rows, wall_rows = [], []
    for name in names:
        kind = models.parse(name)[0]
        for p in precisions:
            if (name, p, "1t", 0, "fsdpc") not in groups:
                continue
            f, e, c = (g(name, p, "1t", 0, s, "cpu_ms") for s in ("fsdpc", "eager", "compile"))
            whole = any(r["cpu_whole_run"] for r in groups[(name, p, "1t", 0, "fsdpc")])
            rss = " / ".join(fmt(g(name, p, "1t", 0, s, "peak_rss_mb"), "%.0f")
                             for s in ("fsdpc", "eager", "compile"))
            t = TARGETS.get(kind)
            met = "–" if t is None or not c or f is None else \
                ("≤ %.2f: met" if f / c <= t else "≤ %.2f: not met") % t
            gap = loss_gap(name, p)
            cpu_rows.append("| %s | %.2f M | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                name, res["models"][name]["params"] / 1e6, p, fmt(f) + (" *" if whole else ""), fmt(e), fmt(c),
                ratio(f, e), ratio(f, c), met, rss, "%.1e" % gap if gap is not None else "?"))
    if cpu_rows:
        out += cpu_head + cpu_rows
    if any(r["cpu_whole_run"] for r in res["runs"] if r["config"] == "1t"):
        out += ["", star]
    wall_head = ["", "**2 threads and 2 ranks × 1 thread, wall ms per step, quiet and beside one busy process** "
            "(the load average when each was measured in brackets: other users' work is a competitor too; target "
            "busy / quiet ≤ %.1f):" % BUSY_TARGET, "",
            "| model | precision | run | side | quiet ms (load) | busy ms (load) | busy / quiet | "
            "quiet: fsdpc / side | CPU ms per step quiet / busy |",
            "| --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for name in names:
        for p in precisions:
            for c, label in (("2t", "1 × 2 threads"), ("2r", "2 ranks × 1 thread")):
                for side in ("fsdpc", "eager", "compile", "ddp"):
                    q, b = g(name, p, c, 0, side, "wall_ms"), g(name, p, c, 1, side, "wall_ms")
                    if q is None:
                        continue
                    ql, bl = g(name, p, c, 0, side, "load"), g(name, p, c, 1, side, "load")
                    wall_rows.append("| %s | %s | %s | %s | %s (%s) | %s (%s) | %s | %s | %s / %s |" % (
                        name, p, label, side, fmt(q), fmt(ql, "%.1f"), fmt(b), fmt(bl, "%.1f"), ratio(b, q),
                        "" if side == "fsdpc" else ratio(g(name, p, c, 0, "fsdpc", "wall_ms"), q),
                        fmt(g(name, p, c, 0, side, "cpu_ms"), "%.0f"), fmt(g(name, p, c, 1, side, "cpu_ms"), "%.0f")))
    if wall_rows:
        out += wall_head + wall_rows
    if res["gemm_share"]:
        out += ["", "**The GPT step's GEMM share** (fsdpc, 1 thread, 5 traced steps, each node's "
                "shortest time but the first step's: the GEMM nodes' (MatMul, MatMulAdd: a GEMM and its fused "
                "epilogue) share of the nodes' time; target ≥ %.0f %%. The trace's times are wall-clock: where the "
                "traced step is well above the CPU time per step, other users preempted its long nodes and the shares "
                "are not its own; perf's samples are CPU time, of a 12-step run with its start-up, and of its last 10 "
                "steps alone (a 2-step run's samples subtracted), where the attention's tile GEMMs count as GEMM):"
                % (GEMM_TARGET * 100), "",
                "| model | precision | traced step ms | 1-thread CPU ms per step | GEMM | fused attention | "
                "the largest others | perf samples: GEMM / fsdpc's code / libm / kernel | the steps alone: GEMM / "
                "fsdpc's code / libm / kernel | perf's largest symbols |",
                "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- |"]
        for name, per in res["gemm_share"].items():
            for p, s in per.items():
                others = ", ".join("%s %.1f %%" % (op, 100 * x) for op, x in s["by_op"]
                                   if op not in GEMM_OPS and "ttention" not in op)
                pf = s.get("perf")
                perf = "%.0f / %.0f / %.0f / %.0f %%" % tuple(100 * pf[k] for k in ("gemm", "own", "libm", "kernel")) \
                    if pf else "(no perf)"
                ps = s.get("perf_steps")
                steps = "%.1f / %.1f / %.1f / %.1f %%" % tuple(100 * ps[k] for k in ("gemm", "own", "libm", "kernel")) \
                    if ps else "(no perf)"
                top = ", ".join("%s %.1f %%" % (sym, 100 * x) for sym, x in pf["top"]) if pf else ""
                out.append("| %s | %s | %.1f | %s | %.1f %% | %.1f %% | %s | %s | %s | %s |" % (
                    name, p, s["step_ms"], fmt(g(name, p, "1t", 0, "fsdpc", "cpu_ms")), 100 * s["gemm"],
                    100 * s["attention"], others, perf, steps, top))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out))  # one blank line between the sections present


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small models, 2 steps: that everything runs")
    ap.add_argument("--models", help="comma-separated bench/models.py names (default: " + DEFAULT + ")")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--configs", default="1t,2t,2r")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per run after a warm-up (default 5; "
                                                            "--quick 2)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
    ap.add_argument("--torch2", default=None, help="a python with torch >= 2 and torchvision (none: fsdpc alone)")
    ap.add_argument("--cores", default="0,1", help="the two cores runs are pinned to; the competitor takes the first")
    ap.add_argument("--json", default="matrix.json")
    ap.add_argument("--keep", action="store_true", help="keep the work folders (models, executables, traces)")
    ap.add_argument("--table", metavar="JSON", nargs="+", help="print the markdown tables of runs' JSON files (each "
                                                               "its own, in turn) and exit")
    a = ap.parse_args()
    if a.table:
        print("\n\n".join(table(json.load(open(f))) for f in a.table))
        return
    a.fsdpc = os.path.abspath(a.fsdpc)
    if a.steps is None:
        a.steps = 2 if a.quick else 5
    if a.steps < 1 or a.repeat < 1:
        raise SystemExit("bench: --steps and --repeat: at least 1")
    run(a)


if __name__ == "__main__":
    main()
