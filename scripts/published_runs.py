"""Predict published FSDP training runs with fsdpc's planner and print predicted against published.

usage: /usr/bin/python3 scripts/published_runs.py FSDPC [--runs FILE] [--only SUBSTR ...] [--work DIR] [--json OUT]
                                                  [--markdown]

For each run of the table (scripts/published_runs.json: runs of other groups than the FSDP paper's authors, each with
its source URL and the figure quoted), this writes the run's model shape with scripts/shaped_model.py (no weights:
--report reads none), plans it with

    fsdpc MODEL --target cuda --precision bf16 --wrap blocks --loss cross_entropy:logits,labels
          --report --world GPUS --hw PROFILE --report-json PLAN.json [--recompute units|selective] [--shard ...]
          [--reduce-dtype bf16]

and prints per run: the predicted tokens/s per GPU (micro-batch x sequence length / predicted step), the published
one and their ratio; the planned peak memory per rank against the GPU's memory (fits or not); fsdpc's model FLOPs per
token over 6N + 12 L T d (N the published parameter count; the attention term as MosaicML's MFU counts it, without
the causal half skipped); and at the end the geometric mean of the ratios.  A run with gradient accumulation is
planned as one micro-batch step (PyTorch FSDP gathers and reduce-scatters every micro-batch as a step does; the
optimizer step, once per global batch there, is in every fsdpc step: a slight over-count of the step).

The profiles (codegen/hw/*.hw) take their figures from datasheets and published microbenchmarks, each cited in the
file; none is fitted to these runs.  Runs in a few seconds each: the whole table in under a minute or two.
"""
import argparse
import json
import math
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
GIB = 1 << 30


def load(path):
    """The table: {'models': {name: shape}, 'runs': [run], 'sources': {key: url}}."""
    with open(path) as f:
        return json.load(f)


def shape_flags(shape, run):
    """shaped_model.py's flags for RUN's model SHAPE (a dict of the table's 'models')."""
    flags = []
    for key in sorted(shape):
        v = shape[key]
        opt = "--" + key.replace("_", "-")
        if v is True:
            flags.append(opt)
        elif v is not False:
            flags += [opt, str(v)]
    return flags + ["--block", str(run["block"]), "--batch", str(run["batch"])]


def plan(fsdpc, table, run, work):
    """fsdpc's --report-json of RUN (a dict), planned in WORK; the JSON as a dict."""
    tag = "".join(c if c.isalnum() else "_" for c in run["name"])
    model = os.path.join(work, tag + ".onnx")
    out = os.path.join(work, tag + ".json")
    subprocess.run([sys.executable, os.path.join(HERE, "shaped_model.py"), model]
                   + shape_flags(table["models"][run["model"]], run), check=True, stdout=subprocess.DEVNULL)
    cmd = [fsdpc, model, "--target", "cuda", "--precision", "bf16", "--wrap", "blocks",
           "--loss", "cross_entropy:logits,labels", "--report", "--world", str(run["gpus"]),
           "--hw", run["hw"], "--report-json", out, "--shard", run.get("shard", "full")]
    if run.get("recompute", "none") != "none":
        cmd += ["--recompute", run["recompute"]]
    if run.get("reduce_dtype"):
        cmd += ["--reduce-dtype", run["reduce_dtype"]]
    if run.get("forward_prefetch"):
        cmd += ["--forward-prefetch"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)


def predict(fsdpc, table, run, work):
    """One row: the run's predicted and published figures (a dict)."""
    p = plan(fsdpc, table, run, work)
    shape = table["models"][run["model"]]
    tokens = run["batch"] * run["block"]
    tps = tokens / p["step_time_s"]
    six_n = 6 * run["params"] + 12 * shape["layers"] * run["block"] * shape["embd"]
    return {
        "name": run["name"], "gpus": run["gpus"], "gpu": run["gpu"], "hw": run["hw"],
        "recompute": run.get("recompute", "none"), "batch": run["batch"], "block": run["block"],
        "predicted_tps": tps, "published_tps": run["published_tps"], "ratio": tps / run["published_tps"],
        "predicted_mfu": 100 * p["mfu"], "published_mfu": run.get("published_mfu"),
        "peak_gib": p["peak_bytes_per_rank"] / GIB, "gpu_gib": run["gpu_gib"],
        "fits": p["peak_bytes_per_rank"] <= run["gpu_gib"] * GIB,
        "params": p["params"], "published_params": run["params"],
        "flops_ratio": p["flops_per_step"] / tokens / six_n,
        "step_s": p["step_time_s"], "exposed_s": p["exposed_comm_s"],
        "source": table["sources"][run["source"]], "quote": run["quote"],
    }


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def print_text(rows):
    print("%-26s %5s %-9s %-13s %9s %9s %6s %8s %8s %5s %7s" % (
        "run", "gpus", "recompute", "hw", "pred t/s", "publ t/s", "ratio", "peak GiB", "GPU GiB", "fits",
        "F/6N+"))
    for r in rows:
        print("%-26s %5d %-9s %-13s %9.0f %9d %6.2f %8.1f %8.1f %5s %7.3f" % (
            r["name"], r["gpus"], r["recompute"], r["hw"], r["predicted_tps"], r["published_tps"], r["ratio"],
            r["peak_gib"], r["gpu_gib"], "yes" if r["fits"] else "NO", r["flops_ratio"]))
    print("geometric mean of predicted / published tokens/s per GPU: %.3f over %d runs (min %.2f, max %.2f); "
          "%d of %d fit the GPU's memory" % (
              geomean([r["ratio"] for r in rows]), len(rows), min(r["ratio"] for r in rows),
              max(r["ratio"] for r in rows), sum(r["fits"] for r in rows), len(rows)))


def print_markdown(rows):
    print("| run | GPUs | recompute | predicted tokens/s/GPU | published | ratio | planned peak GiB | fits |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d x %s | %s | %.0f | %d | %.2f | %.1f | %s |" % (
            r["name"], r["gpus"], r["gpu"], r["recompute"], r["predicted_tps"], r["published_tps"], r["ratio"],
            r["peak_gib"], "yes" if r["fits"] else "no (%.0f GiB)" % r["gpu_gib"]))
    print("\ngeometric mean of the ratios: %.3f over %d runs" % (geomean([r["ratio"] for r in rows]), len(rows)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("fsdpc")
    ap.add_argument("--runs", default=os.path.join(HERE, "published_runs.json"))
    ap.add_argument("--only", action="append", default=[], help="plan only runs whose name contains this")
    ap.add_argument("--work", default="/tmp/published_runs")
    ap.add_argument("--json", help="write the rows as JSON here")
    ap.add_argument("--markdown", action="store_true", help="print a markdown table")
    a = ap.parse_args()
    table = load(a.runs)
    runs = [r for r in table["runs"] if not a.only or any(s in r["name"] for s in a.only)]
    if not runs:
        ap.error("no run matches --only")
    os.makedirs(a.work, exist_ok=True)
    rows = [predict(a.fsdpc, table, r, a.work) for r in runs]
    print_markdown(rows) if a.markdown else print_text(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
