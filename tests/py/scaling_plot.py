"""scripts/plot_scaling.py tells the plans that fit in the device's memory from those that do not.

usage: scaling_plot.py FSDPC WORKDIR

The demo GPT (examples/gpt.onnx, batch 8) on h100-ib at worlds 2, 4, 8, 16, every strategy --report compares:
  - without --device-gib nothing is known of the fit: every point "fits": null in --dump, no "does not fit" in any
    legend, no fits column in the table;
  - with --device-gib G between the smallest planned peak per rank and the next, a point fits exactly where its
    planned GiB per rank (--report's peak) is <= G; each strategy has, in both panels, its solid legend entry where
    some point fits and a "NAME: does not fit in G GiB" entry where some point does not; the table's fits column
    says the same; the PNG is written.
"""
import json
import os
import sys

from common import run

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def plot(fsdpc, work, tag, extra):
    dump, png = os.path.join(work, tag + ".json"), os.path.join(work, tag + ".png")
    script, gpt = os.path.join(ROOT, "scripts", "plot_scaling.py"), os.path.join(ROOT, "examples", "gpt.onnx")
    p = run([sys.executable, script, gpt, "--hw", "h100-ib", "--worlds", "2,4,8,16", "--fsdpc", fsdpc, "-o", png,
             "--dump", dump] + extra + ["--", "--loss", "cross_entropy:logits,labels", "--dim", "batch=8"])
    if not os.path.getsize(png) > 10000:
        raise SystemExit("FAILED: %s: no plausible PNG" % tag)
    return json.load(open(dump)), p.stdout


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    d, table = plot(fsdpc, work, "unknown", [])
    labels = d["legend"]["tflops"] + d["legend"]["memory"]
    if any(p["fits"] is not None for p in d["points"]) or any("does not fit" in l for l in labels) or "fits" in table:
        raise SystemExit("FAILED: without --device-gib no point may be marked:\n%s\n%s" % (d, table))
    print("ok without --device-gib: %d points, none marked" % len(d["points"]))

    gibs = sorted({p["gib"] for p in d["points"]})
    if len(gibs) < 2:
        raise SystemExit("FAILED: the strategies plan one peak only: %s" % gibs)
    g = float("%.6g" % ((gibs[0] + gibs[1]) / 2))
    d, table = plot(fsdpc, work, "device", ["--device-gib", "%.6g" % g])
    rows = {(l.split("|")[1].strip(), int(l.split("|")[2])): l.split("|")[7].strip()
            for l in table.splitlines() if l.startswith("| ") and l.split("|")[2].strip().isdigit()}
    for p in d["points"]:
        want = p["gib"] <= g
        if p["fits"] is not want or rows.get((p["strategy"], p["world"])) != ("yes" if want else "no"):
            raise SystemExit("FAILED: %s at world %d (%.6g GiB, device %g GiB): fits %s, table %s" % (
                p["strategy"], p["world"], p["gib"], g, p["fits"], rows.get((p["strategy"], p["world"]))))
    fit = {(p["strategy"], p["fits"]) for p in d["points"]}
    for panel, prefix in (("tflops", "predicted, "), ("memory", "")):
        want = sorted([prefix + s for s, f in fit if f] + ["%s%s: does not fit in %g GiB" % (prefix, s, g)
                                                           for s, f in fit if not f])
        got = sorted(l for l in d["legend"][panel] if l != "device memory")
        if got != want:
            raise SystemExit("FAILED: the %s panel's legend: %s, expected %s" % (panel, got, want))
    if not any(f for _, f in fit) or all(f for _, f in fit):
        raise SystemExit("FAILED: expected some points to fit in %g GiB and some not: %s" % (g, fit))
    print("ok --device-gib %g: %d of %d points do not fit, marked in both legends and the table"
          % (g, sum(not p["fits"] for p in d["points"]), len(d["points"])))
    print("OK scaling_plot")


if __name__ == "__main__":
    main()
