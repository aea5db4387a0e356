"""fsdpc's --precision bf16 CPU training step against PyTorch 2 under torch.autocast("cpu", dtype=torch.bfloat16),
eager and torch.compile, on the same GPTs: step time, CPU time and peak RSS, one process and two ranks.

    /usr/bin/python3 bench/gpt_bf16.py [--quick] [--threads 2] [--steps 5] [--repeat 3] [--fsdpc build/fsdpc]
                                       [--torch2 PYTHON] [--no-compile] [--fsdp2] [--json FILE] [--from-json FILE]
                                       [--sizes 128/4/128/8,256/6/256/8,512/8/256/8]

The driver runs under Debian's /usr/bin/python3 (torch 1.13 exports the ONNX file fsdpc compiles: bench/gpt_work.py
writes each size's folder, the same model, initial weights and batch for every side).  fsdpc compiles it three
times: --precision bf16 and fp32 for one process (batch B), and --precision bf16 --wrap blocks for 2 ranks (batch
B/2 per rank: FULL_SHARD, its gathers in bf16).  PyTorch 2 (--torch2, found as bench/torch2.py says) runs
bench/torch_step.py with the forward and loss under autocast to bf16, AdamW lr 1e-4 on every side.  Three
configurations, every thread count set explicitly (OMP_NUM_THREADS, OPENBLAS_NUM_THREADS, MKL_NUM_THREADS,
torch.set_num_threads; mpirun -x):
  1 x N threads   one process, --threads threads: fsdpc bf16, fsdpc fp32, torch eager bf16, torch compile bf16;
  1 x 1 thread    the same four on one thread: CPU time per step there is the figure a shared machine's load does
                  not distort;
  2 ranks x 1     fsdpc bf16 under mpirun -np 2, and PyTorch DDP with autocast bf16 over gloo, one thread a rank
                  (--fsdp2: and FSDP2, fully_shard on each block and the model, as fsdpc's units).
Interleaved: each repetition runs every side of every configuration once per size, in turn.  A side's step time is
the median of its timed steps after one warm-up step (the slowest rank's), its CPU time per step that of all its
processes and threads over the timed steps (fsdpc: every thread's run time from /proc as the metrics show each
step end; PyTorch: the process's CPU clock around each step), its peak RSS the largest process's VmHWM (a
torch.compile run before the repetitions fills Inductor's cache, so that every repetition's compilation, in its
warm-up step, is a warm one).  The tables give the best of the repetitions (and the median), fsdpc bf16's ratio to
each other side (below 1: fsdpc bf16 faster or smaller), and the losses of the first steps of every side: they must
agree with fsdpc fp32's within bf16's unit roundoff (--tol, relative), or the comparison is not of the same
computation and the script says so and exits 1.  It also prints the CPU, whether it has AVX512-BF16, and fsdpc's
notes (an executable whose bf16 GEMMs run widened to float32 says so; none: oneDNN's native bf16 GEMM), the commit,
the versions and the load average.  --quick: the smallest size, 3 steps, one repetition (a couple of minutes).
--json FILE keeps every run (written as the run goes); --from-json FILE prints the tables of one and runs nothing.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser()
ap.add_argument("--quick", action="store_true", help="128/4/128/8, 3 steps, 1 repetition")
ap.add_argument("--threads", type=int, default=2, help="threads of the one-process configuration")
ap.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up step")
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--torch2", default="", help="a python with torch >= 2 (default: python3 on PATH if it has it, else "
                "one installed in ~/.cache/fsdpc-bench/torch2)")
ap.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
ap.add_argument("--fsdp2", action="store_true", help="add PyTorch's FSDP2 (fully_shard per block) to the 2 ranks")
ap.add_argument("--sizes", default="128/4/128/8,256/6/256/8,512/8/256/8", help="d/L/T/B,...")
ap.add_argument("--check-steps", type=int, default=3, help="the first steps whose losses are compared")
ap.add_argument("--tol", type=float, default=2 ** -8, help="relative difference of the losses allowed against fsdpc "
                "fp32 (default: bf16's unit roundoff)")
ap.add_argument("--json", default="", help="write every run's figures here")
ap.add_argument("--from-json", default="", help="print the tables of a --json file and run nothing")
args = ap.parse_args()
if args.quick:
    args.sizes, args.steps, args.repeat = "128/4/128/8", 3, 1
for k in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[k] = "1"  # the driver's own torch (the export) stays off the sides' cores

sys.path.insert(0, HERE)
from torch2 import ensure_debian_torch, torch2_python  # noqa: E402

ensure_debian_torch()
import gpt_work  # noqa: E402

WIDENED = "no native bfloat16 GEMM"  # what fsdpc and its executables say where bf16 GEMMs run widened


class Side:
    """one column: who runs (fsdpc's executable or torch_step.py), how (build name or torch mode), threads per
    process, processes"""

    def __init__(self, config, label, fsdpc, what, threads, ranks=1):
        self.config, self.label, self.fsdpc, self.what, self.threads, self.ranks = \
            config, label, fsdpc, what, threads, ranks


def sides_of():
    """every side of the three configurations, in the order a repetition runs them (eager, compile, DDP: PyTorch 2's,
    under autocast)"""
    n = args.threads
    one = "1 x %d threads" % n
    out = []
    for config, t in ((one, n), ("1 x 1 thread", 1)):
        out += [Side(config, "fsdpc bf16", True, "bf16", t), Side(config, "fsdpc fp32", True, "fp32", t),
                Side(config, "eager bf16", False, "eager", t)]
        if not args.no_compile:
            out.append(Side(config, "compile bf16", False, "compile", t))
    out += [Side("2 ranks x 1 thread", "fsdpc bf16", True, "bf16_r2", 1, 2),
            Side("2 ranks x 1 thread", "DDP bf16", False, "ddp", 1, 2)]
    return out + ([Side("2 ranks x 1 thread", "FSDP2 bf16", False, "fsdp2", 1, 2)] if args.fsdp2 else [])


def build_all(work, B):
    """fsdpc's three executables of the size in work; fsdpc's notes"""
    notes = gpt_work.build(args.fsdpc, work, "bf16", B, ["--precision", "bf16"])
    gpt_work.build(args.fsdpc, work, "fp32", B)
    return notes + gpt_work.build(args.fsdpc, work, "bf16_r2", B // 2, ["--precision", "bf16", "--wrap", "blocks"])


def measure(side, work, py2, port):
    """one run of side on the size in work: {wall_ms, cpu_ms, rss, losses, notes}"""
    if side.fsdpc:
        r = gpt_work.run_fsdpc(work, side.what, args.steps + 1, side.threads, side.ranks)
        cpu = r["cpu_step_s"]
    else:
        r = gpt_work.run_torch(py2, work, side.what, side.threads, args.steps, "bf16", side.ranks, port)
        cpu = statistics.mean(r["cpu_s"][1:])
    return dict(wall_ms=statistics.median(r["times_ms"][1:]), cpu_ms=float("nan") if cpu is None else cpu * 1e3,
                rss=r["peak_rss"], losses=r["losses"][:args.check_steps], notes=r["notes"],
                avx512_bf16=r.get("avx512_bf16"))


def machine():
    """the CPU's model name and whether it has AVX512-BF16 (/proc/cpuinfo)"""
    name, bf16 = "unknown CPU", False
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name") and name == "unknown CPU":
            name = line.split(":", 1)[1].strip()
        if line.startswith("flags"):
            bf16 = bf16 or "avx512_bf16" in line.split()
    return name, bf16


def load():
    return open("/proc/loadavg").read().split()[:3]


def commit():
    p = subprocess.run(["git", "-C", HERE, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", HERE, "diff", "--quiet", "HEAD", "--", "."], capture_output=True).returncode
    return p.stdout.strip() + ("+changes" if dirty else "") if p.returncode == 0 else "unknown"


def table(config, sides, sizes, res):
    """the markdown table of one configuration: per side best (median) step ms, CPU ms per step, peak RSS; fsdpc
    bf16's ratios to the others"""
    sd = [s for s in sides if s.config == config]
    ref, others = sd[0], sd[1:]
    print("\n%s: step ms, best of the repetitions (median); CPU ms per step, best; peak RSS\n" % config)
    head = ["d/L/T/B"] + [s.label for s in sd] + ["CPU " + " / ".join(s.label for s in sd)] + \
        ["%s / %s: step, CPU" % (ref.label, s.label) for s in others] + ["peak RSS " + " / ".join(s.label for s in sd)]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for key in sizes:
        runs = {id(s): res[key][sid(s)] for s in sd}
        best = {k: min(r["wall_ms"] for r in v) for k, v in runs.items()}
        med = {k: statistics.median(r["wall_ms"] for r in v) for k, v in runs.items()}
        cpu = {k: min(r["cpu_ms"] for r in v) for k, v in runs.items()}
        rss = {k: max(r["rss"] for r in v) for k, v in runs.items()}
        row = ["/".join(map(str, key))] + ["%.1f (%.1f)" % (best[id(s)], med[id(s)]) for s in sd]
        row.append(" / ".join("%.1f" % cpu[id(s)] for s in sd) + " ms")
        row += ["%.2f, %.2f" % (best[id(ref)] / best[id(s)], cpu[id(ref)] / cpu[id(s)]) for s in others]
        row.append(" / ".join("%.0f" % (rss[id(s)] / 1e6) for s in sd) + " MB")
        print("| " + " | ".join(row) + " |")


def loss_check(sides, sizes, res):
    """prints the first steps' losses of every side (first repetition) and their largest relative difference from
    fsdpc fp32's at the same threads (one process); False where one is beyond --tol"""
    ok = True
    print("\nlosses of the first %d steps (first repetition) and the largest relative difference from fsdpc fp32's "
          "(1 process): the same computation within bf16's rounding (--tol %.2g)" % (args.check_steps, args.tol))
    for key in sizes:
        ref = next(res[key][sid(s)][0]["losses"] for s in sides if s.label == "fsdpc fp32")
        for s in sides:
            ls = res[key][sid(s)][0]["losses"]
            diff = max(abs(a - b) / abs(b) for a, b in zip(ls, ref))
            bad = diff > args.tol or len(ls) != len(ref)
            ok = ok and not bad
            print("  %-14s %-20s %-28s %s  %.1e%s" % ("/".join(map(str, key)), s.config, s.label,
                                                     " ".join("%.5f" % v for v in ls), diff,
                                                     "  BEYOND --tol" if bad else ""))
    return ok


def sid(side):
    """the side's key in the results and the --json file"""
    return "%s | %s" % (side.config, side.label)


def save(res):
    """--json: every run so far (written after each size of each repetition, so that a long run cut short keeps
    what it measured: --from-json prints its tables)"""
    if args.json:
        json.dump({"/".join(map(str, k)): v for k, v in res.items()}, open(args.json, "w"), indent=1)


def report(sides, res):
    """the tables and the loss check of res; False where the losses disagree"""
    sizes = list(res)
    for config in dict.fromkeys(s.config for s in sides):
        table(config, sides, sizes, res)
    return loss_check(sides, sizes, res)


def from_json():
    """--from-json: the report of a saved run (its sides with at least one run of every size)"""
    res = {tuple(int(v) for v in k.split("/")): v for k, v in json.load(open(args.from_json)).items()}
    args.fsdp2 = True
    sides = [s for s in sides_of() if all(r.get(sid(s)) for r in res.values())]
    return report(sides, res)


def run(py2, sides, sizes):
    """prepares every size, runs the repetitions; (results, fsdpc's and the sides' notes, parameter counts, whether
    torch sees AVX512-BF16)"""
    root = tempfile.mkdtemp(prefix="fsdpc-bf16-")
    res, notes, params, port, torch_bf16 = {}, set(), {}, 29517, None
    try:
        for key in sizes:
            work = os.path.join(root, "%d_%d_%d_%d" % key)
            params[key] = gpt_work.prepare(work, *key)
            notes.update(build_all(work, key[3]))
            if not args.no_compile:  # Inductor's cache filled, so that no repetition's peak RSS is a cold compile's
                gpt_work.run_torch(py2, work, "compile", args.threads, 0, "bf16")
            res[key] = {sid(s): [] for s in sides}
        for rep in range(args.repeat):
            for key in sizes:
                work = os.path.join(root, "%d_%d_%d_%d" % key)
                for s in sides:
                    port += 1
                    r = measure(s, work, py2, port)
                    notes.update(r["notes"])
                    res[key][sid(s)].append(r)
                    torch_bf16 = r["avx512_bf16"] if r["avx512_bf16"] is not None else torch_bf16
                print("  repetition %d, %s: %s" % (rep + 1, "/".join(map(str, key)), ", ".join(
                    "%s %s %.1f ms (CPU %.1f)" % (s.config, s.label, res[key][sid(s)][-1]["wall_ms"],
                                                  res[key][sid(s)][-1]["cpu_ms"]) for s in sides)), flush=True)
                save(res)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return res, notes, params, torch_bf16


def main():
    if args.from_json:
        if not from_json():
            sys.exit("bench: a side's losses differ from fsdpc fp32's beyond --tol: not the same computation")
        return
    py2, v2 = torch2_python(args.torch2)
    if not py2:
        sys.exit("bench: gpt_bf16.py compares against PyTorch 2 (--torch2 none leaves nothing to compare)")
    name, has_bf16 = machine()
    sides = sides_of()
    sizes = gpt_work.parse_sizes(args.sizes)
    version = subprocess.run([args.fsdpc, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    print("%s, AVX512-BF16 %s; %s at %s; torch %s (%s: eager, compile and DDP under autocast bf16); load %s at "
          "the start" % (name, "yes" if has_bf16 else "no", version, commit(), v2, py2, " ".join(load())))
    print("%d timed steps after 1 warm-up, %d interleaved repetitions" % (args.steps, args.repeat), flush=True)
    res, notes, params, torch_bf16 = run(py2, sides, sizes)
    widened = [n for n in notes if WIDENED in n]
    print("\nbf16 GEMMs: %s; torch sees AVX512-BF16: %s; load %s at the end" % (
        "WIDENED to float32 (%s)" % widened[0] if widened else "native (oneDNN's bf16 GEMM, no note from fsdpc)",
        torch_bf16, " ".join(load())))
    for n in sorted(notes - set(widened)):
        print("  " + n)
    for key in sizes:
        print("%s: %.2f M parameters" % ("/".join(map(str, key)), params[key] / 1e6))
    if not report(sides, res):
        sys.exit("bench: a side's losses differ from fsdpc fp32's beyond --tol: not the same computation")


if __name__ == "__main__":
    main()
