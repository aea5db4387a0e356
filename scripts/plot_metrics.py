#!/usr/bin/env python3
"""A picture of a run: scripts/plot_metrics.py RUN.jsonl [-o run.png] [--title TEXT]

Reads the metrics file an fsdpc executable writes (--metrics RUN.jsonl: one JSON object per step) and draws,
over the steps, the training loss (and the validation loss where the file has one), the learning rate,
the throughput (tokens/s or samples/s) and rank 0's peak memory, in four panels of one PNG (matplotlib,
Debian's python3-matplotlib; no display needed).  Exits 1 with one line on a file that holds no steps.
"""
import argparse
import json
import os
import sys


def load(path):
    steps = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                o = json.loads(line)
            except ValueError as e:
                sys.exit("plot_metrics: %s line %d is not JSON (%s)" % (path, n, e))
            if isinstance(o, dict) and "step" in o:
                steps.append(o)
    if not steps:
        sys.exit("plot_metrics: %s holds no step records (was it written by --metrics?)" % path)
    return steps


def series(steps, key):
    pts = [(s["step"], s[key]) for s in steps if s.get(key) is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("metrics")
    ap.add_argument("-o", "--out", default=None, help="the PNG (default: METRICS with .png)")
    ap.add_argument("--title", default=None)
    a = ap.parse_args()
    steps = load(a.metrics)
    out = a.out or os.path.splitext(a.metrics)[0] + ".png"
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    x, y = series(steps, "loss")
    ax[0][0].plot(x, y, lw=1, label="train")
    vx, vy = series(steps, "val_loss")
    if vx:
        ax[0][0].plot(vx, vy, "o-", ms=3, label="validation")
    ax[0][0].set_ylabel("loss")
    ax[0][0].legend()
    x, y = series(steps, "lr")
    ax[0][1].plot(x, y, lw=1, color="tab:orange")
    ax[0][1].set_ylabel("learning rate")
    unit = next((s.get("token_unit") for s in steps if s.get("token_unit")), "samples")
    x, y = series(steps, "tokens_per_s")
    ax[1][0].plot(x, y, lw=1, color="tab:green")
    ax[1][0].set_ylabel("%s/s (all ranks)" % unit)
    x, y = series(steps, "peak_rss_bytes")
    ax[1][1].plot(x, [v / 2**20 for v in y], lw=1, color="tab:red")
    ax[1][1].set_ylabel("peak memory, rank 0 (MiB)")
    for row in ax:
        for p in row:
            p.grid(alpha=0.3)
    for p in ax[1]:
        p.set_xlabel("step")
    fig.suptitle(a.title or os.path.basename(a.metrics))
    fig.tight_layout()
    tmp = out + ".tmp.png"
    fig.savefig(tmp, dpi=100)
    os.replace(tmp, out)  # written atomically
    print("plot_metrics: %d steps -> %s" % (len(steps), out))


if __name__ == "__main__":
    main()
