"""bench/matrix.py's plumbing (no timing is asserted): its smallest run writes a well-formed JSON, and its --table
step makes the markdown tables from it.

usage: bench_matrix.py FSDPC WORKDIR

Under Debian's python3 and torch 1.13 (the suite's; the benchmark proper runs under PyTorch 2), with --torch2
none (the fsdpc side alone), one tiny GPT (d 32, 1 layer, T 16, batch 4), fp32, the 1-thread and 2-rank
configurations, 1 timed step:
- the JSON names the machine, the versions and the load, and holds one run per configuration, side and quiet/busy
  (1 thread quiet; 2 ranks quiet and busy: 3 runs), each with a positive wall and CPU time per step, a peak RSS
  and finite losses that agree across the runs (the same batch and weights: the same first loss);
- the GPT's GEMM share (from --trace) is a fraction in (0, 1];
- --table prints the three tables, a row of the model in each.
"""
import json
import math
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MATRIX = os.path.join(ROOT, "bench", "matrix.py")
MODEL = "gpt:32/1/16/4"


def fail(msg):
    sys.exit("bench_matrix: " + msg)


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    out = os.path.join(work, "m.json")
    env = dict(os.environ, TMPDIR=work)
    subprocess.run([sys.executable, MATRIX, "--fsdpc", fsdpc, "--torch2", "none", "--models", MODEL, "--precisions",
                    "fp32", "--configs", "1t,2r", "--steps", "1", "--json", out], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    res = json.load(open(out))
    for key in ("machine", "date", "versions", "load", "models", "runs", "gemm_share"):
        if key not in res:
            fail("%s: no %r" % (out, key))
    if not res["machine"]["cpu"] or "fsdpc" not in res["versions"]["fsdpc"] or "start" not in res["load"]:
        fail("machine/versions/load incomplete: %r %r %r" % (res["machine"], res["versions"], res["load"]))
    got = sorted((r["config"], r["busy"], r["side"]) for r in res["runs"])
    if got != [("1t", 0, "fsdpc"), ("2r", 0, "fsdpc"), ("2r", 1, "fsdpc")]:
        fail("runs %r, expected 1t quiet, 2r quiet and busy, fsdpc each" % got)
    for r in res["runs"]:
        if not (r["wall_ms"] > 0 and r["cpu_ms"] and r["cpu_ms"] > 0 and r["peak_rss_mb"] > 0):
            fail("run %r: a figure is missing or not positive" % r)
        if len(r["losses"]) != 2 or not all(math.isfinite(v) for v in r["losses"]):
            fail("run %r: losses" % r)
    first = [r["losses"][0] for r in res["runs"]]
    if max(first) - min(first) > 1e-4 * abs(first[0]):
        fail("first-step losses differ between runs of the same model: %r" % first)
    share = res["gemm_share"].get(MODEL, {}).get("fp32")
    if not share or not 0 < share["gemm"] <= 1 or not 0 <= share["attention"] < 1:
        fail("GEMM share %r" % share)
    table = subprocess.run([sys.executable, MATRIX, "--table", out], check=True, capture_output=True,
                           text=True).stdout
    rows = [l for l in table.splitlines() if l.startswith("| %s |" % MODEL)]
    if len(rows) != 3:  # the 1-thread row, the 2-rank fsdpc row (its quiet and busy figures), the GEMM share row
        fail("--table: %d rows of %s, expected 3:\n%s" % (len(rows), MODEL, table))
    print("bench_matrix: ok (%d runs, GEMM share %.0f %%)" % (len(res["runs"]), 100 * share["gemm"]))


main()
