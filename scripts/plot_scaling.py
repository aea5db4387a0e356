#!/usr/bin/env python3
"""Predicted scaling: scripts/plot_scaling.py MODEL.onnx --hw PROFILE --worlds 8,16,...,512 [-o scaling.png]
                                              [--points 'LABEL=W:TFLOPS,W:TFLOPS,...'] [--flops model|hardware]
                                              [--device-gib G] [--dump PATH.json] [--fsdpc PATH] -- FLAGS...

Runs `fsdpc MODEL.onnx FLAGS --report --world W --hw PROFILE --report-json ...` for every W (the model is
planned, never built: a model without its weights will do) and draws, against the device count, the predicted
TFLOPS per device and the planned memory per rank of every strategy --report compares (full, grad_op, none,
hybrid:2 where it divides the world), in two panels of one PNG (matplotlib; no display needed).  TFLOPS count the
model's FLOPs (--flops model, the default, as the executables' MFU does) or the hardware's (--flops hardware: with
the work activation recompute adds).  --points adds measured points to the TFLOPS panel (repeatable), e.g. the FSDP
paper's GPT-175B figures: --points 'paper, batch 1=128:173,256:173,512:173'; --device-gib draws the device's
memory on the memory panel (log scale) and tells the plans that fit from those that do not: a plan whose planned
peak per rank (--report's) is above G GiB could not run, so its points are drawn hollow and faded on a dotted
line, in both panels, under a legend entry "NAME: does not fit in G GiB", and the table says "no" in its fits
column.  Prints the table it drew; --dump writes what it drew as JSON (every point with its fit, each panel's
legend).  FLAGS (after --) are the compile flags of the model, e.g. -- --target cuda --precision bf16
--recompute units --wrap blocks --loss cross_entropy:logits,labels --dim batch=1.  Exits 1 with one line on a
failed fsdpc run or a bad flag.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def points(spec):
    label, _, rest = spec.rpartition("=")
    try:
        pts = [(int(w), float(t)) for w, t in (p.split(":") for p in rest.split(","))]
    except ValueError:
        sys.exit("plot_scaling: --points %r: expected 'LABEL=W:TFLOPS,W:TFLOPS,...'" % spec)
    return label or "measured", pts


def main():
    argv = sys.argv[1:]
    flags = []
    if "--" in argv:
        flags = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--hw", required=True)
    ap.add_argument("--worlds", default="8,16,32,64,128,256,512")
    ap.add_argument("-o", "--out", default="scaling.png")
    ap.add_argument("--points", action="append", default=[])
    ap.add_argument("--title", default="")
    ap.add_argument("--flops", choices=["model", "hardware"], default="model")
    ap.add_argument("--device-gib", type=float, default=0)
    ap.add_argument("--dump", default="")
    ap.add_argument("--fsdpc", default=os.path.join(HERE, "..", "build", "fsdpc"))
    a = ap.parse_args(argv)
    try:
        worlds = [int(w) for w in a.worlds.split(",")]
    except ValueError:
        sys.exit("plot_scaling: --worlds %r: expected a list of integers" % a.worlds)
    extra = [points(p) for p in a.points]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in worlds:
            out = os.path.join(tmp, "r%d.json" % w)
            p = subprocess.run([a.fsdpc, a.model] + flags + ["--report", "--world", str(w), "--hw", a.hw,
                                                            "--report-json", out], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit("plot_scaling: fsdpc at world %d: %s" % (w, (p.stderr.strip() or "failed").splitlines()[-1]))
            r = json.load(open(out))
            for s in r["strategies"]:
                tf = s["tflops_per_device" if a.flops == "model" else "hw_tflops_per_device"]
                rows.setdefault(s["strategy"], []).append((w, tf, s["peak_bytes_per_rank"] / 2**30,
                                                  s["step_time_s"], s["exposed_comm_s"]))
    fits = lambda gib: gib <= a.device_gib if a.device_gib > 0 else None  # None: unknown, drawn as running
    fit_col = " fits in %g GiB |" % a.device_gib if a.device_gib > 0 else ""
    print("| strategy | devices | step s | TFLOPS per device (%s FLOPs) | exposed comm s | planned GiB per rank |%s"
          % (a.flops, fit_col))
    print("|---|---|---|---|---|---|%s" % ("---|" if fit_col else ""))
    for name, pts in rows.items():
        for w, tf, gib, st, ex in pts:
            fit = (" yes |" if fits(gib) else " no |") if fit_col else ""
            print("| %s | %d | %.3f | %.1f | %.3f | %.2f |%s" % (name, w, st, tf, ex, gib, fit))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (name, pts) in enumerate(rows.items()):
        color = colors[i % len(colors)]
        for ax, y, label in ((ax1, 1, "predicted, " + name), (ax2, 2, name)):
            draw(ax, pts, y, color, label, fits, a.device_gib)
    for label, pts in extra:
        ax1.scatter([p[0] for p in pts], [p[1] for p in pts], marker="x", s=70, zorder=5, label=label)
    if a.device_gib > 0:
        ax2.axhline(a.device_gib, color="black", linestyle="--", linewidth=1, label="device memory")
    for ax, yl in ((ax1, "TFLOPS per device (%s FLOPs)" % a.flops), (ax2, "planned memory per rank (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(worlds)
        ax.set_xticklabels([str(w) for w in worlds])
        ax.set_xlabel("devices")
        ax.set_ylabel(yl)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    top = max([p[1] for pts in rows.values() for p in pts] + [p[1] for _, pts in extra for p in pts])
    ax1.set_ylim(0, top * 1.15)
    ax2.set_yscale("log")
    fig.suptitle(a.title or "%s on %s" % (os.path.basename(a.model), a.hw))
    fig.tight_layout()
    tmp = a.out + ".tmp.%d.png" % os.getpid()
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, a.out)
    print("wrote %s" % a.out)
    if a.dump:
        json.dump({"device_gib": a.device_gib or None,
                   "points": [{"strategy": name, "world": w, "tflops": tf, "gib": gib, "fits": fits(gib)}
                              for name, pts in rows.items() for w, tf, gib, _, _ in pts],
                   "legend": {panel: [t.get_text() for t in ax.get_legend().get_texts()]
                              for panel, ax in (("tflops", ax1), ("memory", ax2))}}, open(a.dump, "w"), indent=1)


def draw(ax, pts, y, color, label, fits, device_gib):
    """one strategy's points (world, tflops, gib, ...) on ax, y their column: those that fit solid under label,
    those that do not hollow and faded on a dotted line under "NAME: does not fit in G GiB"; a line joins them"""
    xs, ys = [p[0] for p in pts], [p[y] for p in pts]
    ok = [fits(p[2]) is not False for p in pts]
    ax.plot(xs, ys, color=color, alpha=0.35, linestyle=":", linewidth=1)
    good = [(x, v) for x, v, f in zip(xs, ys, ok) if f]
    bad = [(x, v) for x, v, f in zip(xs, ys, ok) if not f]
    if good:
        ax.plot([p[0] for p in good], [p[1] for p in good], color=color, marker="o", label=label)
    if bad:
        ax.plot([p[0] for p in bad], [p[1] for p in bad], color=color, marker="o", markerfacecolor="none",
                alpha=0.45, linestyle="none", label="%s: does not fit in %g GiB" % (label, device_gib))


main()
