"""fsdpc --report --hw: the cost model's predicted step against hand counts, and its JSON report.

usage: plan.py FSDPC WORKDIR EXAMPLES_DIR [--no-timing]

Models: a one-MatMul model (y = x @ W, mse loss; x [64, 256], W [256, 128]) and the demo GPT
(examples/gpt.onnx, batch 8).  Profiles are written here with round numbers so that every term of
codegen/cost.c can be counted by hand:
  - compute-bound (peak 1 TFLOP/s, memory and links 1e9 GB/s, no overheads): the MatMul model's compute
    time is its hardware FLOPs over the peak, within 1e-6, and those FLOPs are 2 x 64 x 256 x 128 for the
    forward and again for dW (x needs no gradient);
  - link-bound (FLOPs and memory 1e9 times faster than the links): at world 4 FULL_SHARD its
    communication time is the plan's bytes sent over the bus bandwidth (plus the loss's all-reduce); with
    2 devices per node and inter-node links half as fast, hybrid:2's gathers and reduce-scatters stay
    inside a node and its all-reduce over the replicas crosses nodes, each term as counted from the
    report's unit sizes;
  - every rate doubled halves the step time exactly (no latencies, no overheads);
  - the cuda target's two lanes of collectives (gathers, reductions): link-bound, its step is still its
    communication (the lanes share the links); the GPT in bf16 with --prefetch none exposes less on cuda than on
    the cpu target's one communication thread (the same compute and collectives), with backward_pre the same;
  - the GPT on a100-roce at world 4: step >= compute, exposed <= communication, prefetch none exposes
    more communication than backward_pre, TFLOPS = FLOPs / step, MFU = TFLOPS / the bf16 peak with
    --precision bf16;
  - --report-json's keys (step_time_s, tflops_per_device, peak_bytes_per_rank, strategy, ...) for the build's
    strategy and every strategy, equal to the text report's table; null times without --hw;
  - bad profiles and flags are one line and exit 1: unknown name, missing file, unknown or repeated key,
    missing key, a non-number, an efficiency above 1, a NUL byte, --hw without --report, --calibrate with a model;
  - identical constants stored once: two Constant nodes of the same values, one in the arena, an initializer
    equal to them still trained;
  - fsdpc --calibrate on 2 ranks writes a profile with every key (bf16 and fp16 GEMM peaks too: bf16 and fp16
    plans read them), --hw reads it; the figures it flags as untrusted
    (a comment line each) are those it warns of, one line each;
  - calibrated at world 1, the predicted step of a GPT of bench/'s smallest size (d 128, 4 layers, T 128, batch 8)
    is within 40 % of its measured step (the best of 3 medians of 12 steps; the test runs alone: RUN_SERIAL; the
    figure is printed; not under the sanitizers, --no-timing); a miss is calibrated and measured once more (a
    neighbour busy for the seconds of one calibration), and the second must hold.  bench/plan_cpu.py is the full comparison.
"""
import json
import os
import re
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from common import check, run

fsdpc, work, examples = sys.argv[1:4]
timing = "--no-timing" not in sys.argv[4:]  # the sanitizer build: its kernels' speed is not the machine's
os.makedirs(work, exist_ok=True)

B, K, N = 64, 256, 128
W = np.random.default_rng(0).standard_normal((K, N)).astype(np.float32)
g = helper.make_graph([helper.make_node("MatMul", ["x", "W"], ["y"])], "mm",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, [B, K])],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [B, N])],
                      [numpy_helper.from_array(W, "W")])
mm = os.path.join(work, "mm.onnx")
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), mm)
gpt = os.path.join(examples, "gpt.onnx")
GPT = [gpt, "--loss", "cross_entropy:logits,labels", "--dim", "batch=8"]
MM = [mm, "--loss", "mse:y,target"]


# identical constants are stored once (passes/consts.c): y = ((x @ C1) @ W) @ C2 with C1 and C2 two Constant nodes
# of the same 32 x 32 values (4096 B each, fixed: not initializers) and W a trained initializer equal to them too:
# after autodiff only C1 is read, the arena holds one of them, and W stays the one trained parameter
C = np.random.default_rng(1).standard_normal((32, 32)).astype(np.float32)
cg = helper.make_graph([helper.make_node("Constant", [], ["C1"], value=numpy_helper.from_array(C, "c1")),
                        helper.make_node("Constant", [], ["C2"], value=numpy_helper.from_array(C, "c2")),
                        helper.make_node("MatMul", ["x", "C1"], ["h1"]), helper.make_node("MatMul", ["h1", "W"], ["h2"]),
                        helper.make_node("MatMul", ["h2", "C2"], ["y"])], "consts",
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 32])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], [numpy_helper.from_array(C, "W")])
cm = os.path.join(work, "consts.onnx")
onnx.save(helper.make_model(cg, opset_imports=[helper.make_opsetid("", 17)]), cm)
CM = [cm, "--loss", "mse:y,target", "--target", "cpu"]
out = run([fsdpc] + CM + ["--report"]).stdout
cbytes = int(re.search(r"arena: constants\s+(\d+) B", out).group(1))
check(4096 <= cbytes < 2 * 4096, "the two identical constants stored once: arena constants %d B" % cbytes)
check(re.search(r"^trained .*: W \(1, 4096 B\)$", out, re.M), "W trained: %s" % out[:300])
dump = run([fsdpc] + CM + ["--dump-after", "autodiff"]).stdout
ids = dict((m.group(2), m.group(1)) for m in re.finditer(r'^\s*(%\d+) \S+ const "([^"]+)"', dump, re.M))
reads = lambda v: sum(1 for l in dump.splitlines() if " = " in l and re.search(r"%s(?!\d)" % v, l.split(" = ", 1)[1]))
check(reads(ids["C1"]) >= 2 and reads(ids["C2"]) == 0, "every reader of C2 reads C1: C1 read %d times, C2 %d times"
      % (reads(ids["C1"]), reads(ids["C2"])))
# ... but state a node writes is never shared: two BatchNorms in training mode, whose running means (zeros) and
# variances (ones) are alike at the start, keep their own (each updated by its own Assign)
z, o = np.zeros(8, np.float32), np.ones(8, np.float32)
inits = [numpy_helper.from_array(a, n) for n, a in (("s1", o), ("b1", z), ("m1", z), ("v1", o), ("s2", o),
                                                     ("b2", z), ("m2", z), ("v2", o))]
bg = helper.make_graph([helper.make_node("BatchNormalization", ["x", "s1", "b1", "m1", "v1"], ["h", "rm1", "rv1"],
                                         training_mode=1),
                        helper.make_node("BatchNormalization", ["h", "s2", "b2", "m2", "v2"], ["y", "rm2", "rv2"],
                                         training_mode=1)], "bn",
                       [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 3, 3])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8, 3, 3])], inits)
bm = os.path.join(work, "bn.onnx")
onnx.save(helper.make_model(bg, opset_imports=[helper.make_opsetid("", 17)]), bm)
dump = run([fsdpc, bm, "--loss", "mse:y,target", "--target", "cpu", "--dump-after", "autodiff"]).stdout
stats = re.findall(r"= BatchNormalization %\d+, %\d+, %\d+, (%\d+), (%\d+)", dump)
check(len(stats) == 2 and len({v for pair in stats for v in pair}) == 4,
      "two BatchNorms' running statistics are four values, not shared: %s" % stats)

def profile(name, **kv):
    base = dict(devices_per_node=8, peak_tflops_f32=1, gemm_efficiency=1, mem_bw_gbs=1e9, op_overhead_us=0,
                intra_busbw_gbs=1e9, intra_latency_us=0, inter_busbw_gbs=1e9, inter_latency_us=0)
    base.update(kv)
    path = os.path.join(work, name + ".hw")
    with open(path, "w") as f:
        f.write("# written by tests/py/plan.py\ndescription %s\n" % name)
        for k, v in base.items():
            f.write("%s %r\n" % (k, v))
    return path


def report(model, world, hw=None, extra=(), target="cpu"):
    out = os.path.join(work, "r.json")
    if os.path.exists(out):
        os.unlink(out)
    cmd = [fsdpc] + model + ["--target", target, "--report", "--world", str(world), "--report-json", out] + list(extra)
    if hw:
        cmd += ["--hw", hw]
    p = run(cmd)
    with open(out) as f:
        return json.load(f), p.stdout


def close(a, b, tol, what):
    check(abs(a - b) <= tol * max(abs(a), abs(b), 1e-300), "%s: %.12g vs %.12g (tolerance %g)" % (what, a, b, tol))


# compute-bound: the MatMul model's FLOPs over the peak
r, _ = report(MM, 1, profile("compute", peak_tflops_f32=1))
flops = 2.0 * B * K * N * 2
close(r["flops_per_step"], flops, 0, "model FLOPs of x @ W (forward and dW)")
close(r["hw_flops_per_step"], flops, 0, "hardware FLOPs (nothing recomputed)")
close(r["compute_s"], flops / 1e12, 1e-6, "compute time = FLOPs / peak")
close(r["comm_s"], 0, 0, "world 1: no communication")
close(r["step_time_s"], r["compute_s"], 1e-12, "world 1: step = compute")
close(r["tflops_per_device"], flops / r["step_time_s"] / 1e12, 1e-12, "TFLOPS = FLOPs / step")
close(r["mfu"], r["tflops_per_device"] / 1.0, 1e-12, "MFU against the 1 TFLOP/s peak")

# gemm_efficiency scales the GEMM term
r2, _ = report(MM, 1, profile("half", peak_tflops_f32=1, gemm_efficiency=0.5))
close(r2["compute_s"], 2 * r["compute_s"], 1e-6, "gemm_efficiency 0.5 doubles the compute time")
# attention_efficiency scales the fused attention's term alone (default: gemm_efficiency): the demo GPT, compute-bound
GPT = [os.path.join(examples, "gpt.onnx"), "--loss", "cross_entropy:logits,labels", "--dim", "batch=8"]
cb = dict(peak_tflops_f32=1e-3, mem_bw_gbs=1e12)
t = {(ge, ae): report(GPT, 1, profile("attn_%g_%g" % (ge, ae), gemm_efficiency=ge, **cb, **(
    {"attention_efficiency": ae} if ae else {})))[0]["compute_s"] for ge, ae in ((1, 0), (1, 1), (0.5, 1), (1, 0.5),
                                                                                 (0.5, 0.5))}
close(t[1, 0], t[1, 1], 1e-12, "attention_efficiency defaults to gemm_efficiency")
check(t[1, 0.5] > t[1, 1] * 1.01, "attention_efficiency 0.5: compute %g s, %g s at 1" % (t[1, 0.5], t[1, 1]))
close(t[0.5, 0.5] - t[1, 1], (t[0.5, 1] - t[1, 1]) + (t[1, 0.5] - t[1, 1]), 1e-6,
      "gemm_efficiency and attention_efficiency scale disjoint parts of the step")


def units(text):
    """the report's unit sizes (elements)"""
    return [int(m.group(1)) for m in re.finditer(r"params\s+(\d+) elements", text)]


# link-bound: communication = bytes over the bus bandwidth
fast = dict(peak_tflops_f32=1e9, mem_bw_gbs=1e12)
r, text = report(MM, 4, profile("links", intra_busbw_gbs=1, inter_busbw_gbs=1, **fast))
# the scalars all-reduced over 4 ranks (the loss, the squared gradient norm), one float32 each
nar = run([fsdpc] + MM + ["--target", "cpu", "--dump-after", "memplan"]).stdout.count("= AllReduce ")
check(nar == 2, "the loss and the gradient norm all-reduced: %d AllReduce nodes" % nar)
loss_ar = nar * 2 * 3 / 4 * 4
close(r["comm_s"], (r["sent_bytes_per_step"] + loss_ar) / 1e9, 1e-9, "world 4 full: comm = bytes sent / busbw")
check(r["step_time_s"] >= r["comm_s"] and r["exposed_comm_s"] <= r["comm_s"] * (1 + 1e-12),
      "the step outlasts its communication, and exposes no more than it")
close(r["step_time_s"], r["comm_s"], 1e-3, "link-bound: the step is its communication")
# the cuda target's two lanes (gathers, reductions) share the links: a second stream adds no bandwidth
rc, _ = report(MM, 4, profile("links", intra_busbw_gbs=1, inter_busbw_gbs=1, **fast), target="cuda")
close(rc["comm_s"], r["comm_s"], 1e-9, "cuda: the same collectives")
close(rc["step_time_s"], rc["comm_s"], 1e-3, "cuda link-bound: the step is its communication, on two lanes too")
n = units(text)
check(n == [K * N], "one unit of W's %d elements: %s" % (K * N, n))
S = 4 * K * N  # the flat float32 buffer (K N divides by 2 and 4: no padding)
# hybrid:2 at world 4, 2 devices per node, inter-node links at half speed
r, _ = report(MM + ["--shard", "hybrid:2"], 4,
              profile("nodes", devices_per_node=2, intra_busbw_gbs=1, inter_busbw_gbs=0.5, **fast))
inside = (S / 2 + S / 2) / 1e9                      # gather + reduce-scatter in the group of 2: (F-1)/F S each
# the shard all-reduced over the 2 replicas, across nodes: both ranks of a node at once, sharing the node's link
across = 2 * (2 * (2 - 1) / 2 * (S / 2)) / 0.5e9
close(r["comm_s"], inside + across + loss_ar / 0.5e9, 1e-9, "hybrid:2: group inside a node, replicas across")
check(r["strategy"] == "hybrid:2", "the build's strategy: %s" % r["strategy"])

# every rate doubled: the step halves
r1, _ = report(GPT, 4, profile("rates1", peak_tflops_f32=0.05, mem_bw_gbs=5, intra_busbw_gbs=0.5))
r2, _ = report(GPT, 4, profile("rates2", peak_tflops_f32=0.1, mem_bw_gbs=10, intra_busbw_gbs=1))
close(r2["step_time_s"], r1["step_time_s"] / 2, 1e-9, "every rate doubled halves the step")

# a shipped profile on the GPT, bf16, world 4; the text table equals the JSON
r, text = report(GPT + ["--precision", "bf16"], 4, "a100-roce")
check(r["hw"] == "a100-roce" and r["world"] == 4 and r["strategy"] == "full", "header: %s" % r)
close(r["peak_tflops"], 312, 0, "bf16 peak of a100-roce")
close(r["tflops_per_device"], r["flops_per_step"] / r["step_time_s"] / 1e12, 1e-12, "TFLOPS")
close(r["mfu"], r["tflops_per_device"] / 312, 1e-12, "MFU against the bf16 peak")
check(r["step_time_s"] >= r["compute_s"] and r["exposed_comm_s"] <= r["comm_s"], "step >= compute, exposed <= comm")
names = [s["strategy"] for s in r["strategies"]]
check(names == ["full", "grad_op", "none", "hybrid:2"], "every strategy: %s" % names)
for s in r["strategies"]:
    for k in ("step_time_s", "tflops_per_device", "peak_bytes_per_rank", "mfu", "exposed_comm_s", "compute_s",
              "comm_s", "sent_bytes_per_step", "state_bytes_per_rank"):
        check(k in s, "key %s in %s" % (k, s["strategy"]))
    m = re.search(r"^\s+%s\s+(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)$" % re.escape(s["strategy"]), text,
                  re.M)
    check(m is not None, "the table has a row for %s" % s["strategy"])
    check(int(m.group(1)) == s["peak_bytes_per_rank"] and int(m.group(3)) == s["sent_bytes_per_step"],
          "table and JSON agree on %s's bytes" % s["strategy"])
    close(float(m.group(4)), s["step_time_s"], 1e-3, "table and JSON agree on %s's step" % s["strategy"])
check(r["strategies"][0]["step_time_s"] == r["step_time_s"], "the top level is the build's row")
check(re.search(r"^predicted on a100-roce \(A100-SXM4-80GB.*world 4: step ", text, re.M), "the prediction line")

# prefetch: slow links, the GPT at world 4: none waits longer than backward_pre
slow = profile("slow", peak_tflops_f32=0.02, mem_bw_gbs=20, intra_busbw_gbs=0.2, intra_latency_us=10,
               op_overhead_us=1)
pre, _ = report(GPT + ["--wrap", "blocks"], 4, slow)
none, _ = report(GPT + ["--wrap", "blocks", "--prefetch", "none"], 4, slow)
check(none["exposed_comm_s"] > pre["exposed_comm_s"] * 1.05 and none["step_time_s"] > pre["step_time_s"],
      "prefetch none exposes more: %.6g vs %.6g s" % (none["exposed_comm_s"], pre["exposed_comm_s"]))
close(none["comm_s"], pre["comm_s"], 1e-9, "the same collectives either way")
# the cuda target's gathers run on a lane of their own: with --prefetch none a backward gather no longer queues
# behind the float32 reduce-scatter (twice its bytes in bf16) started before it, and exposes less than on the cpu
# target's one communication thread; backward_pre issues it first, so there it is the same
slowb = profile("slowb", peak_tflops_f32=0.02, peak_tflops_bf16=0.02, mem_bw_gbs=20, intra_busbw_gbs=0.2,
                intra_latency_us=10, op_overhead_us=1)
lanes = {}
for t in ("cpu", "cuda"):
    for pf in ("backward_pre", "none"):
        lanes[t, pf], _ = report(GPT + ["--wrap", "blocks", "--precision", "bf16", "--prefetch", pf], 4, slowb,
                                 target=t)
# (the same collectives on both targets; the cpu target computes a little less, its 16-bit LayerNorm backward
# reading the residual without a Cast: passes/precision.c's cpu_low, so the lanes are compared by what they expose)
for pf in ("backward_pre", "none"):
    close(lanes["cuda", pf]["comm_s"], lanes["cpu", pf]["comm_s"], 1e-9, "%s: comm_s the same on both targets" % pf)
    c, g = lanes["cpu", pf]["compute_s"], lanes["cuda", pf]["compute_s"]
    check(0.99 * g < c < g, "%s: the cpu target's compute a little less (no Casts before the LayerNorm backward): "
          "%.9g vs %.9g s" % (pf, c, g))
close(lanes["cuda", "backward_pre"]["exposed_comm_s"], lanes["cpu", "backward_pre"]["exposed_comm_s"], 1e-9,
      "backward_pre: one lane or two, the same exposed communication")
check(lanes["cuda", "none"]["exposed_comm_s"] < 0.95 * lanes["cpu", "none"]["exposed_comm_s"] and
      lanes["cuda", "none"]["step_time_s"] < lanes["cpu", "none"]["step_time_s"],
      "prefetch none: two lanes expose less than one: %.6g vs %.6g s" % (lanes["cuda", "none"]["exposed_comm_s"],
                                                                         lanes["cpu", "none"]["exposed_comm_s"]))

# without --hw: the plan, times null
r, _ = report(GPT, 2)
check(r["hw"] is None and r["step_time_s"] is None and r["tflops_per_device"] is None and
      r["peak_bytes_per_rank"] > 0 and r["strategy"] == "full", "no --hw: %s" % r)

# bad profiles and flags: one line, exit 1
def bad(args, want):
    p = run([fsdpc] + GPT + ["--target", "cpu"] + args, check=False)
    lines = p.stderr.strip().split("\n")
    check(p.returncode == 1 and len(lines) == 1 and re.search(want, lines[0]),
          "%s: rc %d, stderr %r (wanted %r)" % (args, p.returncode, p.stderr, want))


def text_profile(name, body):
    path = os.path.join(work, name)
    with open(path, "wb") as f:
        f.write(body)
    return path


good = open(profile("good"), "rb").read()
bad(["--report", "--hw", "tpu-v9"],
    r"--hw tpu-v9: no such profile \(shipped: a100-400g, a100-roce, a100-roce1600, h100-800g, h100-ib;")
bad(["--report", "--hw", os.path.join(work, "absent.hw")], r"absent\.hw.*No such file")
bad(["--report", "--hw", text_profile("k.hw", good + b"peak_tflops_f33 1\n")], r"unknown key 'peak_tflops_f33'")
bad(["--report", "--hw", text_profile("d.hw", good + b"mem_bw_gbs 3\n")], r"'mem_bw_gbs' given twice")
bad(["--report", "--hw", text_profile("m.hw", re.sub(rb"mem_bw_gbs.*\n", b"", good))], r"'mem_bw_gbs' is missing")
bad(["--report", "--hw", text_profile("n.hw", good.replace(b"gemm_efficiency 1", b"gemm_efficiency fast"))],
    r"'fast' of 'gemm_efficiency' is not a number")
bad(["--report", "--hw", text_profile("e.hw", good.replace(b"gemm_efficiency 1", b"gemm_efficiency 1.5"))],
    r"gemm_efficiency is a share of the peak")
bad(["--report", "--hw", text_profile("z.hw", good + b"\0")], r"a NUL byte")
bad(["--report", "--hw", text_profile("neg.hw", good.replace(b"intra_latency_us 0", b"intra_latency_us -1"))],
    r"intra_latency_us must be >= 0")
bad(["--hw", "a100-roce", "-o", os.path.join(work, "x")], r"--hw a100-roce: the profile is for --report")
bad(["--report", "--hw", text_profile("f64.hw", good)] + ["--precision", "bf16"],
    r"profile f64 gives no peak_tflops_bf16, and the model computes its GEMMs in bf16")
bad(["--calibrate"], r"--calibrate measures this machine: it takes no model")

# --calibrate on 2 ranks writes a profile --hw reads
cal = os.path.join(work, "here.hw")
p = run([fsdpc, "--calibrate", "--world", "2", "-o", cal],
        env={"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
check(re.search(r"^calibrate: .*here\.hw: float32 GEMM .* TFLOPS.*2 ranks: all-gather", p.stdout, re.M),
      "the calibration's line: %r" % p.stdout)
prof = dict(l.split("#")[0].split(None, 1) for l in open(cal) if l.split("#")[0].strip())
for k in ("peak_tflops_f32", "peak_tflops_f64", "peak_tflops_bf16", "peak_tflops_f16", "gemm_efficiency", "mem_bw_gbs", "mem_efficiency", "op_overhead_us",
          "intra_busbw_gbs", "intra_rs_busbw_gbs", "inter_busbw_gbs", "comm_overlap"):
    check(k in prof and float(prof[k]) >= 0, "calibrated %s: %s" % (k, prof.get(k)))
check(prof["devices_per_node"].strip() == "2" and float(prof["peak_tflops_f32"]) > 0.001 and
      0 < float(prof["gemm_efficiency"]) <= 1 and 0 < float(prof["mem_efficiency"]) <= 1 and
      prof["comm_overlap"].strip() in ("0", "1"), "calibrated values: %s" % prof)
# figures it cannot trust (runtime/cal_trust.h; the rule itself: the calibrate_trust test): each named in the profile
# and in one warning line, the same reasons in the same order; the profile still loads
flagged = [l[2:].rstrip("\n") for l in open(cal) if re.match(r"# \S+ untrusted: ", l)]
warned = [l[len("calibrate: warning: "):-len("; calibrate again on a quiet machine")] for l in p.stderr.splitlines()
          if l.startswith("calibrate: warning: ")]
check(flagged == warned and all(w.split()[0] in prof and w.split()[1] == "untrusted:" for w in warned),
      "untrusted figures: the profile says %s, the warnings %s" % (flagged, p.stderr))
print("plan: calibration at world 2: %d figure(s) untrusted%s" % (len(warned), "".join("\n  " + w for w in warned)))
r, _ = report(GPT, 2, cal)
check(r["hw"] == "here" and r["step_time_s"] > 0 and r["comm_s"] > 0, "a calibrated prediction: %s" % r)
# the calibrated bf16 and fp16 GEMMs (oneDNN's native bf16 or widened, as the executable's) plan those precisions
for prec, key in (("bf16", "peak_tflops_bf16"), ("fp16", "peak_tflops_f16")):
    rp, _ = report(GPT + ["--precision", prec], 2, cal)
    close(rp["peak_tflops"], float(prof[key]), 1e-5, "the calibrated %s plan's peak" % prec)
    check(rp["step_time_s"] > 0, "a calibrated %s prediction: %s" % (prec, rp))
check(not [f for f in os.listdir(work) if ".tmp." in f], "no temporary file left")

# the calibrated prediction against the measured step: a GPT of bench/'s smallest size (d 128, 4 layers, T 128,
# batch 8, vocab 256; scripts/shaped_model.py, random weights) at world 1 on the threads the tests give a rank
cal1 = os.path.join(work, "one.hw")
gm = os.path.join(work, "g128.onnx")
run([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "shaped_model.py"),
     gm, "--layers", "4", "--embd", "128", "--heads", "2", "--block", "128", "--batch", "8", "--vocab", "256",
     "--data", "random"])
exe = os.path.join(work, "g128")
np.random.default_rng(0).integers(0, 256, 41 * 8 * 128 + 1).astype("<u2").tofile(os.path.join(work, "tok.bin"))
met = os.path.join(work, "g128.jsonl")


def attempt():
    """calibrate, predict, measure: the prediction over the measured step (the best of 3 medians of 12 steps)"""
    p = run([fsdpc, "--calibrate", "--world", "1", "-o", cal1])
    busy = [l for l in p.stderr.splitlines() if l.startswith("calibrate: warning: ")]
    r, _ = report([gm, "--loss", "cross_entropy:logits,labels", "-o", exe], 1, cal1)
    times = []
    for rep in range(3):  # the best of 3 medians: this machine's speed drifts
        if os.path.exists(met):
            os.unlink(met)
        run([exe, "--tokens", os.path.join(work, "tok.bin"), "--steps", "13", "--lr", "1e-4", "--metrics", met,
             "--quiet"])
        t = sorted(json.loads(l)["time_ms"] for l in open(met) if '"step"' in l)[1:]  # less the slowest (warm-up)
        times.append(t[len(t) // 2] / 1e3)
    ratio = r["step_time_s"] / min(times)
    print("plan: calibrated prediction %.2f ms, measured %.2f ms (best of %s), ratio %.3f%s"
          % (r["step_time_s"] * 1e3, min(times) * 1e3, ["%.2f" % (x * 1e3) for x in times], ratio,
             "".join("\n  " + w for w in busy)))
    return ratio


if not timing:
    attempt()
    print("plan: ok (the prediction's accuracy not checked: sanitizer build)")
    sys.exit(0)
# a second attempt (calibration and measurement again) only when the first misses: a neighbour that takes this
# machine's cores for the seconds of one calibration (seen on CI: the kernel mix 31 % apart, the prediction 1.67x)
# says nothing of the cost model; a model that is wrong misses twice
ratio = attempt()
if not 0.6 <= ratio <= 1 / 0.6:
    ratio = attempt()
check(0.6 <= ratio <= 1 / 0.6, "the calibrated prediction within 40 %% of the measured step: %.3f" % ratio)
print("plan: ok")
