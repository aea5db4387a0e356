"""--precision bf16 where the bf16 GEMMs are widened (a CPU without AVX512-BF16) against --precision fp32: one
process at 2 threads (wall time per step) and at 1 thread (CPU time per step), the sides interleaved.

    /usr/bin/python3 bench/bf16_widened.py [--models gpt:128/4/128/8,gpt:256/6/256/8,bert:128/4/128/8]
                                           [--repeat 3] [--steps 8] [--fsdpc build/fsdpc] [--base FSDPC]
                                           [--isa AVX512_CORE_VNNI] [--json FILE]

Each model (bench/models.py's names; bench/gpt_work.py writes its folder: the ONNX export, weights, one batch) is
compiled with --precision bf16 and fp32 by --fsdpc, and with --base (another fsdpc, e.g. the merge base's build)
also as bf16 `base`.  Every run has DNNL_MAX_CPU_ISA=--isa (AVX512_CORE_VNNI: Intel Cascade Lake's ISA, below
AVX512-BF16, so oneDNN has no native bf16 GEMM and the executable widens them, as it says in its note) and every
thread count set explicitly (gpt_work.thread_env).  Each repetition runs, per model, every side at 2 threads and
then every side at 1 thread, in turn (the order rotating by repetition), so a slow minute of the machine hits all
sides.  A side's wall time is the median of its steps after the first (the warm-up), its CPU time per step that
of all its threads between the end of the first step and the end of the last (/proc schedstat,
gpt_work.run_fsdpc); the load average (1 min) is recorded beside every run.  The table gives each side's best
and median over the repetitions and bf16 / fp32 of both (the median of the per-repetition ratios too: the sides
of one repetition ran within seconds of each other).  At 2 threads the CPU time counts the threads' waiting
(spinning) too, so the wall time is the figure there; at 1 thread the CPU time is the one a loaded machine
distorts least.  The losses of the first step must agree between the sides within 2e-2 (bf16 against fp32) or
the script exits 1.  --json FILE keeps every run and the table's figures.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt_work  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--models", default="gpt:128/4/128/8,gpt:256/6/256/8,bert:128/4/128/8")
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--steps", type=int, default=8)
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--base", help="another fsdpc whose bf16 build runs as the side `base`")
ap.add_argument("--isa", default="AVX512_CORE_VNNI", help="DNNL_MAX_CPU_ISA for every run")
ap.add_argument("--json")
args = ap.parse_args()


def load():
    return os.getloadavg()[0]


def git_head():
    p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE)
    return p.stdout.strip()


def main():
    root = tempfile.mkdtemp(prefix="fsdpc-bf16w-")
    os.environ["DNNL_MAX_CPU_ISA"] = args.isa  # the compiler's note too
    env = {"DNNL_MAX_CPU_ISA": args.isa}
    out = dict(date=datetime.datetime.utcnow().strftime("%Y-%m-%d %H:%M UTC"), commit=git_head(), isa=args.isa,
               steps=args.steps, repeat=args.repeat, base=args.base, load_start=os.getloadavg(), runs=[],
               table=[])
    models = [m for m in args.models.split(",") if m]
    sides = ["bf16", "fp32"] + (["base"] if args.base else [])
    notes = {}
    try:
        for name in models:
            work = os.path.join(root, name.replace(":", "_").replace("/", "_"))
            gpt_work.prepare_model(work, name)
            batch = int(name.split("/")[-1])
            notes[name] = gpt_work.build(args.fsdpc, work, "bf16", batch, ["--precision", "bf16"])
            gpt_work.build(args.fsdpc, work, "fp32", batch)
            if args.base:
                gpt_work.build(args.base, work, "base", batch, ["--precision", "bf16"])
        for r in range(args.repeat):
            for name in models:
                work = os.path.join(root, name.replace(":", "_").replace("/", "_"))
                for threads in (2, 1):
                    order = sides[r % len(sides):] + sides[:r % len(sides)]
                    for side in order:
                        d = gpt_work.run_fsdpc(work, side, args.steps, threads, env=env)
                        run = dict(model=name, side=side, threads=threads, rep=r,
                                   wall_ms=statistics.median(d["times_ms"][1:]),
                                   cpu_ms=d["cpu_step_s"] * 1e3 if d["cpu_step_s"] else None,
                                   loss0=d["losses"][0], load=load(), notes=d["notes"])
                        out["runs"].append(run)
                        notes.setdefault(name, [])
                        notes[name] += [n for n in d["notes"] if n not in notes[name]]
                        print("rep %d %-18s %d thr %-4s wall %7.2f ms  cpu %7.2f ms  load %.2f" %
                              (r, name, threads, side, run["wall_ms"], run["cpu_ms"] or 0, run["load"]), flush=True)
                        if args.json:
                            json.dump(out, open(args.json, "w"), indent=1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out["load_end"] = os.getloadavg()
    bad = 0
    for name in models:
        for threads, key in ((2, "wall_ms"), (1, "cpu_ms")):
            def vals(side):
                return [x[key] for x in out["runs"] if x["model"] == name and x["threads"] == threads
                        and x["side"] == side]

            def per_rep(side):
                return {x["rep"]: x[key] for x in out["runs"] if x["model"] == name and x["threads"] == threads
                        and x["side"] == side}
            row = dict(model=name, threads=threads, figure=key)
            for side in sides:
                row[side] = dict(best=min(vals(side)), median=statistics.median(vals(side)))
            b, f = per_rep("bf16"), per_rep("fp32")
            row["bf16/fp32"] = dict(best=row["bf16"]["best"] / row["fp32"]["best"],
                                    median=row["bf16"]["median"] / row["fp32"]["median"],
                                    per_rep_median=statistics.median(b[k] / f[k] for k in b))
            if args.base:
                row["base/fp32"] = dict(best=row["base"]["best"] / row["fp32"]["best"],
                                        median=row["base"]["median"] / row["fp32"]["median"])
            row["load"] = [min(x["load"] for x in out["runs"] if x["model"] == name and x["threads"] == threads),
                           max(x["load"] for x in out["runs"] if x["model"] == name and x["threads"] == threads)]
            out["table"].append(row)
        l0 = {x["side"]: x["loss0"] for x in out["runs"] if x["model"] == name}
        for side in sides:
            if abs(l0[side] - l0["fp32"]) > 2e-2 * abs(l0["fp32"]):
                print("bench: %s: step-1 loss of %s %.6g against fp32's %.6g" % (name, side, l0[side], l0["fp32"]))
                bad = 1
    out["notes"] = notes
    if args.json:
        json.dump(out, open(args.json, "w"), indent=1)
    print("\nDNNL_MAX_CPU_ISA=%s, commit %s, %d repetitions of %d steps; load %s at the start, %s at the end; notes:" %
          (args.isa, out["commit"], args.repeat, args.steps, out["load_start"], out["load_end"]))
    for n in sorted({n.split(": ", 1)[-1] for v in notes.values() for n in v}):
        print("  " + n)
    print("| model | threads | figure | bf16 best (median) | fp32 best (median) |%s bf16/fp32 best (median; per-rep "
          "median) |%s load |" % (" base best (median) |" if args.base else "", " base/fp32 |" if args.base else ""))
    print("|---|---|---|---|---|%s---|%s---|" % ("---|" if args.base else "", "---|" if args.base else ""))
    for row in out["table"]:
        base = " %.2f (%.2f) |" % (row["base"]["best"], row["base"]["median"]) if args.base else ""
        basr = " %.3f (%.3f) |" % (row["base/fp32"]["best"], row["base/fp32"]["median"]) if args.base else ""
        print("| %s | %d | %s | %.2f (%.2f) | %.2f (%.2f) |%s %.3f (%.3f; %.3f) |%s %.1f-%.1f |" %
              (row["model"], row["threads"], "wall ms" if row["figure"] == "wall_ms" else "CPU ms/step",
               row["bf16"]["best"], row["bf16"]["median"], row["fp32"]["best"], row["fp32"]["median"], base,
               row["bf16/fp32"]["best"], row["bf16/fp32"]["median"], row["bf16/fp32"]["per_rep_median"], basr,
               row["load"][0], row["load"][1]))
    return bad


if __name__ == "__main__":
    sys.exit(main())
