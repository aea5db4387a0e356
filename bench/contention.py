"""The step beside a competing busy process: fsdpc's CPU training step (and PyTorch eager's, measured the same way)
quiet and with one busy loop on one of its cores, at 1 thread, 2 threads and 2 ranks x 1 thread (issue 32's target:
with the competitor, at most 2.5x the quiet step); the competitor started before the run (busy) or once the first
step is done (late: the executable's start-up did not see it).

    /usr/bin/python3 bench/contention.py [--size 128/4/128/8] [--steps 6] [--repeat 3] [--fsdpc build/fsdpc]
                                         [--torch PYTHON|none] [--cores 0,1] [--configs 1t,2t,2r]

Every run is pinned with taskset: 1 thread to the first of --cores, 2 threads or 2 ranks to both; the competitor is
`taskset -c FIRST sh -c 'while :; do :; done'`, started before the run (busy) or when the metrics file shows the
first step (late), and killed after it.  The sides:
  fsdpc        the executable as a user runs it: at start-up it looks whether the cores are oversubscribed and, where
               they are, its OpenMP threads wait passively, else they spin briefly (GOMP_SPINCOUNT=1000) and then
               sleep; Open MPI yields when idle (its threads line says which);
  fsdpc spin   the same with FSDPC_WAIT=spin: libgomp's and Open MPI's default spinning, as before that decision;
  torch eager  bench/torch_step.py (eager; DDP over gloo at 2 ranks) under --torch (default /usr/bin/python3 when
               it has torch >= 2; none: left out), its threads set the same way.
The work folder (the GPT, its weights and batch, fsdpc's executables for 1 and 2 ranks) is bench/gpt_work.py's.
Interleaved: each repetition runs every configuration and side quiet, busy and late, in turn.  A run's figure is
the median of its timed steps (after one warm-up); the table gives the median over the repetitions of the wall
time per step (the slowest rank's), the loaded/quiet ratio, and the CPU seconds per step of all the side's threads
(fsdpc: /proc schedstat between the first and the last step; PyTorch: CLOCK_PROCESS_CPUTIME_ID, summed over ranks).
Say the machine's load (printed) beside the figures: other work on these cores is a competitor too.
"""
import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gpt_work  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--size", default="128/4/128/8", help="d/L/T/B")
ap.add_argument("--steps", type=int, default=6)
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
ap.add_argument("--torch", default="/usr/bin/python3", help="a python with torch >= 2 (none: leave PyTorch out)")
ap.add_argument("--cores", default="0,1", help="two cores the runs are pinned to; the competitor takes the first")
ap.add_argument("--configs", default="1t,2t,2r", help="which of 1t (1 thread), 2t (2 threads), 2r (2 ranks)")
args = ap.parse_args()

CONFIGS = [c for k, c in (("1t", ("1 thread", 1, 1)), ("2t", ("2 threads", 2, 1)), ("2r", ("2 ranks", 1, 2)))
           if k in args.configs.split(",")]  # (name, threads, ranks)
MODES = ("quiet", "busy", "late")


def has_torch(py):
    if py == "none":
        return False
    p = subprocess.run([py, "-c", "import torch, numpy; assert int(torch.__version__.split('.')[0]) >= 2"],
                       capture_output=True)
    return p.returncode == 0


def load():
    return open("/proc/loadavg").read().split()[0]


def one(side, work, threads, ranks, prefix):
    """(wall ms per step, CPU s per step) of one run of side"""
    if side.startswith("fsdpc"):
        env = {"FSDPC_WAIT": "spin"} if side == "fsdpc spin" else {}
        r = gpt_work.run_fsdpc(work, "train%d" % ranks, args.steps + 1, threads, ranks, prefix=prefix, env=env)
        return statistics.median(r["times_ms"][1:]), r["cpu_step_s"]
    r = gpt_work.run_torch(args.torch, work, "ddp" if ranks > 1 else "eager", threads, args.steps, ranks=ranks,
                           prefix=prefix)
    return statistics.median(r["times_ms"][1:]), statistics.median(r["cpu_s"][1:])


def med(v):
    """the median of v's figures (a run whose CPU time could not be read gives None)"""
    v = [x for x in v if x is not None]
    return statistics.median(v) if v else None


def cpu(x):
    return "%.3f" % x if x is not None else "?"


def run(side, work, threads, ranks, mode):
    cores = args.cores.split(",")
    prefix = ["taskset", "-c", ",".join(cores[:max(threads, ranks)])]
    # the late competitor waits for this run's first step line: fsdpc's metrics file, torch_step.py's step file
    metrics = os.path.join(work, "train%d.jsonl" % ranks) if side.startswith("fsdpc") else os.environ["BENCH_STEP_FILE"]
    if os.path.exists(metrics):
        os.unlink(metrics)
    late = metrics if mode == "late" else None
    with gpt_work.competitor(cores[0] if mode != "quiet" else None, after=late):
        return one(side, work, threads, ranks, prefix)


def main():
    signal.signal(signal.SIGTERM, lambda *_: sys.exit("bench: terminated"))  # the competitor is killed on the way out
    d, L, T, B = gpt_work.parse_sizes(args.size)[0]
    sides = ["fsdpc", "fsdpc spin"] + (["torch eager"] if has_torch(args.torch) else [])
    if "torch eager" not in sides:
        print("note: no torch >= 2 under %s: the PyTorch side is left out" % args.torch)
    print("load before: %s (/proc/loadavg, 1 min)" % load())
    with tempfile.TemporaryDirectory() as work:
        work = os.path.join(work, "g")
        os.environ["BENCH_STEP_FILE"] = os.path.join(work, "torch.steps")  # torch_step.py's runs inherit it
        gpt_work.prepare(work, d, L, T, B)
        for ranks in (1, 2):
            gpt_work.build(args.fsdpc, work, "train%d" % ranks, B // ranks)
        res = {}
        for rep in range(args.repeat):  # interleaved: a slow minute of the machine hits every side
            for name, threads, ranks in CONFIGS:
                for side in sides:
                    for mode in MODES:
                        res.setdefault((name, side, mode), []).append(run(side, work, threads, ranks, mode))
            print("repetition %d of %d done, load %s" % (rep + 1, args.repeat, load()), flush=True)
    print("\n%s GPT (d/L/T/B), %d timed steps after 1 warm-up, median of %d interleaved repetitions; busy: one "
          "`while :; do :; done` on core %s from before the start (late: from the end of the first step)\n"
          % (args.size, args.steps, args.repeat, args.cores.split(",")[0]))
    print("| run | side | quiet ms | busy ms | late ms | busy/quiet | late/quiet | CPU s/step quiet | busy | late |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, _, _ in CONFIGS:
        for side in sides:
            q, b, l = ([med(v) for v in zip(*res[(name, side, k)])] for k in MODES)
            print("| %s | %s | %.1f | %.1f | %.1f | %.2fx | %.2fx | %s | %s | %s |" % (
                name, side, q[0], b[0], l[0], b[0] / q[0], l[0] / q[0], cpu(q[1]), cpu(b[1]), cpu(l[1])))
    print("\nload after: %s" % load())


main()
