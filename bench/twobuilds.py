"""Two builds of one step side by side (before / after a change), interleaved: CPU ms a step, and the wall ms a step
quiet and beside one busy process, at 1 or 2 threads.

    python3 bench/twobuilds.py --work DIR --pair NAME=OLD_EXE,NEW_EXE[,VAR=VALUE...] [--pair ...] [--threads 2]
                               [--repeat 8]

DIR holds idx.npy and lab.npy (bench/gpt_work.py's batch: `python3 bench/matrix.py ... --keep` prints such a
folder); each executable trains it (--data input_ids=..., labels=...).  A pair's VAR=VALUE are set for both sides
(DNNL_MAX_CPU_ISA=AVX512_CORE: the widened bf16 GEMMs).  Each repetition runs every pair's old then new side:
13 steps quiet, 3 steps quiet, 13 steps with `taskset -c 0 sh -c 'while :; do :; done'` running; pinned with taskset
(2 threads: cores 0,1; 1 thread: core 1).  CPU ms a step: the children's CPU time of 13 steps less 3's, over 10
(start-up cancels); wall: the median time_ms of steps 4..13 in the metrics.  The table gives the medians over the
repetitions and new/old ratios; say the load (`uptime`, printed before and after each repetition) beside them.
2026-11-28 (the 16-bit GEMMs joining the step's team, GPT 128/4/128/8, 2 threads, 8 repetitions, load 2.5-2.8): new/old
CPU 0.97-1.00, quiet wall 0.99-1.01, busy 0.95-1.02 (bf16 native, widened, fp16); at load 3-6 the 2-thread wall
times were bimodal for both sides (the quiet step as slow as the busy one).
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile

ap = argparse.ArgumentParser()
ap.add_argument("--work", required=True)
ap.add_argument("--pair", action="append", required=True, help="NAME=OLD_EXE,NEW_EXE[,VAR=VALUE...]")
ap.add_argument("--threads", default="2", choices=("1", "2"))
ap.add_argument("--repeat", type=int, default=8)
a = ap.parse_args()
pairs = []
for p in a.pair:
    name, _, rest = p.partition("=")
    f = rest.split(",")
    if len(f) < 2 or not all("=" in v for v in f[2:]):
        raise SystemExit("bench: --pair %r: NAME=OLD_EXE,NEW_EXE[,VAR=VALUE...]" % p)
    pairs.append((name, {"old": f[0], "new": f[1]}, dict(v.split("=", 1) for v in f[2:])))
metrics = os.path.join(tempfile.mkdtemp(prefix="twobuilds-"), "m.jsonl")


def run(exe, steps, env, busy):
    """(CPU seconds of the run, median wall ms of its steps after the third)"""
    e = dict(os.environ, OMP_NUM_THREADS=a.threads, OPENBLAS_NUM_THREADS=a.threads, **env)
    comp = subprocess.Popen(["taskset", "-c", "0", "sh", "-c", "while :; do :; done"]) if busy else None
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        subprocess.run(["taskset", "-c", "0,1" if a.threads == "2" else "1", exe, "--data",
                        "input_ids=" + os.path.join(a.work, "idx.npy"), "--data",
                        "labels=" + os.path.join(a.work, "lab.npy"), "--steps", str(steps), "--lr", "1e-4", "--quiet",
                        "--metrics", metrics], env=e, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    finally:
        if comp:
            comp.kill()
            comp.wait()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = [r["time_ms"] for r in map(json.loads, open(metrics)) if "step" in r and r["step"] > 3]
    return (r1.ru_utime + r1.ru_stime) - (r0.ru_utime + r0.ru_stime), statistics.median(t) if t else float("nan")


res = {}
print(os.popen("uptime").read().strip(), flush=True)
for rep in range(a.repeat):
    for name, exes, env in pairs:
        for side in ("old", "new"):
            c13, quiet = run(exes[side], 13, env, False)
            c3, _ = run(exes[side], 3, env, False)
            _, busy = run(exes[side], 13, env, True)
            d = res.setdefault((name, side), {"cpu": [], "quiet": [], "busy": []})
            d["cpu"].append((c13 - c3) / 10 * 1e3)
            d["quiet"].append(quiet)
            d["busy"].append(busy)
    print("repetition %d: %s" % (rep + 1, os.popen("uptime").read().strip()), flush=True)
print("%d threads, medians of %d repetitions" % (int(a.threads), a.repeat))
print("%-16s %-4s %9s %9s %9s %6s" % ("pair", "side", "CPU ms", "quiet ms", "busy ms", "b/q"))
for name, _, _ in pairs:
    med = {s: {k: statistics.median(v) for k, v in res[(name, s)].items()} for s in ("old", "new")}
    for s in ("old", "new"):
        print("%-16s %-4s %9.2f %9.2f %9.2f %6.2f" % (name, s, med[s]["cpu"], med[s]["quiet"], med[s]["busy"],
                                                      med[s]["busy"] / med[s]["quiet"]))
    print("%-16s new/old CPU %.3f quiet %.3f busy %.3f" % (name, *(med["new"][k] / med["old"][k]
                                                                   for k in ("cpu", "quiet", "busy"))))
