"""The progress line and the metrics' speed fields: what a step did, per second and against a peak.

usage: progress.py FSDPC WORKDIR

Models whose FLOPs are known by hand (float32):
  mlp:  x [4, 16] -> Gemm 16x32 -> Relu -> Gemm 32x8 -> y, mse: forward 2B(16*32 + 32*8), backward dW1, dW2 and
        dh (not dx: x is data) 2B(16*32 + 2*32*8): 3584 B FLOPs per rank per step;
  conv: x [2, 3, 8, 8] -> Conv 4x3x3x3 (pads 1) -> y, mse: the forward and dW, 2 * 2*4*8*8 * 27 each.
fsdpc --report prints exactly that count; a run at world 2 writes per step tokens_per_s = samples of all ranks
/ step time (mse: samples; cross_entropy: label positions, "tok"), tflops = FLOPs / step time, mfu =
tflops / --peak-tflops, eta_s = mean step time so far x steps left, peak_rss_bytes > 0; --accum 2 doubles the
FLOPs of a step; the step line shows loss, lr, grad norm (with --clip-grad-norm), ms, samples/s, TFLOPS, MFU,
mem and ETA, and the run ends with a summary line; scripts/plot_metrics.py draws a metrics file into a PNG
(and refuses one without steps in one line); without --peak-tflops on cpu the peak is measured (a
positive figure); two GEMM threads pinned to one core (a machine made busy for certain) get their peak from their
CPU time and it is flagged untrusted at start-up, in the summary and in the metrics; --quiet prints no step, peak or summary line while the metrics keep every field.
"""
import json
import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, mpirun, run


def save(path, nodes, inits, x_shape, y_shape):
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                          [numpy_helper.from_array(v, k) for k, v in inits.items()])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


def steps(metrics):
    return [json.loads(l) for l in open(metrics) if '"step"' in l]


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(3)
    f32 = lambda *s: (rng.standard_normal(s) * 0.3).astype(np.float32)
    B = 4
    save(os.path.join(work, "mlp.onnx"), [helper.make_node("Gemm", ["x", "w1", "b1"], ["h"]),
                                          helper.make_node("Relu", ["h"], ["r"]),
                                          helper.make_node("Gemm", ["r", "w2", "b2"], ["y"])],
         {"w1": f32(16, 32), "b1": f32(32), "w2": f32(32, 8), "b2": f32(8)}, [B, 16], [B, 8])
    save(os.path.join(work, "conv.onnx"), [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
         {"w": f32(4, 3, 3, 3)}, [2, 3, 8, 8], [2, 4, 8, 8])
    cases = {"mlp": (3584 * B, [B, 16], [B, 8], B), "conv": (2 * (2 * 2 * 4 * 8 * 8 * 27), [2, 3, 8, 8],
                                                            [2, 4, 8, 8], 2)}
    for name, (flops, xs, ys, samples) in cases.items():
        model, exe = os.path.join(work, name + ".onnx"), os.path.join(work, name)
        p = run([fsdpc, model, "-o", exe, "--target", "cpu", "--loss", "mse:y,t", "--report", "--verify"])
        m = re.search(r"FLOPs per rank per step [^:]*: (\S+)", p.stdout)
        check(m and float(m.group(1)) == flops, "%s: --report FLOPs %s, expected %d" % (name, m and m.group(1),
                                                                                      flops))
        for k, shape in (("x", xs), ("t", ys)):
            np.save(os.path.join(work, "%s.%s.npy" % (name, k)), f32(4 * shape[0], *shape[1:]))
        data = ["--data", "x=%s.x.npy" % exe, "--data", "t=%s.t.npy" % exe]
        for accum in (1, 2):
            mpath = "%s.a%d.jsonl" % (exe, accum)
            p = run(mpirun(2, [exe] + data + ["--steps", "5", "--accum", str(accum), "--peak-tflops", "0.5",
                                          "--clip-grad-norm", "100", "--metrics", mpath]))
            lines = [l for l in p.stdout.splitlines() if l.startswith("step ")]
            check(len(lines) == 5 and all(w in lines[-1] for w in ("loss", "lr 0.001", "grad norm", " ms",
                                                                      "samples/s", "TFLOPS", "MFU", "mem", "ETA")),
                  "%s: step lines %s" % (name, lines))
            check(re.search(r"^done: 5 steps in [0-9.]+ s, \S+ samples/s, \S+ TFLOPS per rank \(MFU [0-9.]+%\), "
                            r"peak memory \d+ MB", p.stdout, re.M), "%s: no summary line:\n%s" % (name, p.stdout))
            st = steps(mpath)
            check(len(st) == 5, "%s: %d metrics lines" % (name, len(st)))
            done = 0.0
            for i, s in enumerate(st):
                t = s["time_ms"] * 1e-3
                done += t
                want = {"tokens_per_s": samples * 2 * accum / t, "tflops": flops * accum / t * 1e-12,
                        "mfu": flops * accum / t * 1e-12 / 0.5, "eta_s": done / (i + 1) * (5 - i - 1)}
                for k, v in want.items():
                    check(abs(s[k] - v) <= 2e-3 * abs(v) + 2e-3, "%s accum %d step %d: %s %s, expected %s"
                          % (name, accum, i + 1, k, s[k], v))
                check(s["token_unit"] == "samples" and s["peak_rss_bytes"] > 1e6 and s["peak_tflops"] == 0.5 and
                      "grad_norm" in s, "%s: metrics line %s" % (name, s))
            print("ok %-4s accum %d: FLOPs %d per micro-step; %s samples/s, %.4g TFLOPS, MFU %.3g%% at step 5"
                  % (name, accum, flops, round(st[-1]["tokens_per_s"]), st[-1]["tflops"], 100 * st[-1]["mfu"]))
    # the measured peak (no --peak-tflops), --quiet, and tokens for cross_entropy
    exe = os.path.join(work, "mlp")
    p = run(mpirun(2, [exe, "--data", "x=%s.x.npy" % exe, "--data", "t=%s.t.npy" % exe, "--steps", "2"]))
    m = re.search(r"^peak: (\S+) TFLOPS per rank", p.stdout, re.M)
    check(m and float(m.group(1)) > 0, "no measured peak:\n%s" % p.stdout)
    q = run(mpirun(2, [exe, "--data", "x=%s.x.npy" % exe, "--data", "t=%s.t.npy" % exe, "--steps", "2", "--quiet",
                       "--metrics", exe + ".q.jsonl"]))
    check(not re.search(r"^(step |done:|peak:)", q.stdout, re.M) and
          all("mfu" in s and "tflops" in s for s in steps(exe + ".q.jsonl")),
          "--quiet: %r, %s" % (q.stdout, open(exe + ".q.jsonl").read()))
    print("ok measured peak %s TFLOPS; --quiet prints no step, peak or summary line; the metrics keep the fields" % m.group(1))
    # A busy machine, made certain: the probe's two GEMM threads share one core, so they get at most half their
    # time.  The peak comes from their CPU time, and is flagged as untrusted where it is printed and stored.
    env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
    b = run(["taskset", "-c", str(min(os.sched_getaffinity(0))), exe, "--data", "x=%s.x.npy" % exe, "--data", "t=%s.t.npy" % exe, "--steps", "2",
             "--metrics", exe + ".busy.jsonl"], env=env)
    u = re.search(r"^peak: (\S+) TFLOPS per rank \(untrusted: the probe's GEMM threads ran (\d+) % of the time",
                  b.stdout, re.M)
    check(u and float(u.group(1)) > 0 and int(u.group(2)) <= 55, "oversubscribed probe not flagged:\n%s" % b.stdout)
    check(re.search(r"^done: .*\(MFU [0-9.]+% against an untrusted peak\)", b.stdout, re.M) and
          all(s["peak_trusted"] is False for s in steps(exe + ".busy.jsonl")), "untrusted peak: %s" % b.stdout)
    print("ok two GEMM threads on one core: peak %s TFLOPS from their CPU time, flagged (they ran %s %% of the time)"
          % (u.group(1), u.group(2)))
    g = helper.make_graph([helper.make_node("Gather", ["emb", "ids"], ["h"]),
                           helper.make_node("MatMul", ["h", "w"], ["logits"])], "g",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [2, 5, 7])],
                          [numpy_helper.from_array(f32(7, 6), "emb"), numpy_helper.from_array(f32(6, 7), "w")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), os.path.join(work, "lm.onnx"))
    lm = os.path.join(work, "lm")
    p = run([fsdpc, lm + ".onnx", "-o", lm, "--target", "cpu", "--loss", "cross_entropy:logits,labels", "--report"])
    m = re.search(r"FLOPs per rank per step [^:]*: (\S+)", p.stdout)
    # forward 2*10*6*7, dW 2*10*6*7, dh 2*10*7*6 (the embedding's gradient is a scatter, no product)
    check(m and float(m.group(1)) == 3 * 2 * 10 * 6 * 7, "lm: --report FLOPs %s" % (m and m.group(1)))
    np.save(lm + ".ids.npy", rng.integers(0, 7, (4, 5)).astype(np.int64))
    np.save(lm + ".labels.npy", rng.integers(0, 7, (4, 5)).astype(np.int64))
    p = run(mpirun(2, [lm, "--data", "ids=%s.ids.npy" % lm, "--data", "labels=%s.labels.npy" % lm, "--steps", "2",
                       "--metrics", lm + ".jsonl"]))
    s = steps(lm + ".jsonl")[-1]
    check("tok/s" in p.stdout and s["token_unit"] == "tok" and
          abs(s["tokens_per_s"] - 2 * 10 / (s["time_ms"] * 1e-3)) <= 2e-3 * s["tokens_per_s"] + 2e-3,
          "cross_entropy: %s\n%s" % (s, p.stdout))
    print("ok cross_entropy counts label positions: %s tok/s" % round(s["tokens_per_s"]))
    # the picture of a run: a PNG of loss, lr, tokens/s and memory; a file without steps is one line
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    plot = os.path.join(root, "scripts", "plot_metrics.py")
    png = os.path.join(work, "run.png")
    p = run([sys.executable, plot, lm + ".jsonl", "-o", png])
    head = open(png, "rb").read(24)
    check(head[:8] == b"\x89PNG\r\n\x1a\n" and int.from_bytes(head[16:20], "big") >= 800 and
          os.path.getsize(png) > 10000, "plot_metrics wrote no plausible PNG: %r" % head)
    open(os.path.join(work, "empty.jsonl"), "w").write('{"memory": {}}\n')
    q = run([sys.executable, plot, os.path.join(work, "empty.jsonl")], check=False)
    check(q.returncode == 1 and len(q.stderr.strip().splitlines()) == 1 and "no step records" in q.stderr,
          "plot_metrics on a file without steps: %d %r" % (q.returncode, q.stderr))
    print("ok plot_metrics: %s (%d bytes, %d px wide); a file without steps is one line"
          % (png, os.path.getsize(png), int.from_bytes(head[16:20], "big")))
    print("OK progress")


if __name__ == "__main__":
    main()
