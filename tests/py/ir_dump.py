"""--dump-after and --report: the IR after every pass, collectives after shard,
and the compile-time memory plan equal to what the executable carves.

usage: ir_dump.py FSDPC MODEL.onnx   (the example MLP)
"""
import json
import os
import re
import sys
import tempfile

from common import check, mpirun, run

PASSES = "frontend fold shape loss autodiff optim units shard precision recompute fuse schedule pack memplan".split()


def schedule_order(cmd):
    """the scheduled node list of cmd: (op, name) per line, and where each name is"""
    nodes = run(cmd).stdout.split("nodes:")[1].strip().splitlines()
    items = [(re.search(r"(?:= )?([A-Z]\w+)[ \n]", l.split("=", 1)[-1] if " = " in l else l).group(1),
              re.search(r'# "(.*)"$', l).group(1)) for l in nodes]
    return items, {name: i for i, (op, name) in enumerate(items)}


def check_schedule(cmd, what):
    """--prefetch / --forward-prefetch / --max-inflight as schedule.c promises, on the dump after schedule"""
    def peak_live(items):  # the root's buffer, kept from forward to backward, is not counted (as --max-inflight)
        live = peak = 0
        for op, n in items:
            if not n.startswith("root."):
                live += (op == "AllGather") - (op == "Free")
            peak = max(peak, live)
        return peak
    needed = peak_live(schedule_order(cmd + ["--dump-after", "schedule", "--prefetch", "none"])[0])
    for mode in ("backward_pre", "backward_post", "none"):
        for fwd in ((), ("--forward-prefetch",)):
            for K in (1, 2):
                flags = ["--prefetch", mode, "--max-inflight", str(K)] + list(fwd)
                items, at = schedule_order(cmd + ["--dump-after", "schedule"] + flags)
                tag = "%s %s" % (what, " ".join(flags))
                gathers = [n for op, n in items if op == "AllGather"]
                fg = [n for n in gathers if not n.endswith(".bwd")]
                bg = [n for n in gathers if n.endswith(".bwd")]
                check(len(bg) >= 2 and len(fg) >= 2, "%s: gathers %s" % (tag, gathers))
                if "root.gather" in at:  # the root gathered once, kept to its last backward use (as PyTorch's FSDP)
                    check("root.gather.bwd" not in at and at["root.free"] > at["loss.grad"],
                          "%s: the root is resharded after forward: %s" % (tag, gathers))
                # every collective has its wait after it; gathered buffers live at once <= max(K, without prefetch)
                for op, n in items:
                    if op in ("AllGather", "ReduceScatter", "AllReduce"):
                        check(at.get(n + ".wait", -1) > at[n], "%s: %s is not waited for after it starts" % (tag, n))
                peak = peak_live(items)
                check(peak <= max(K, needed), "%s: %d gathered buffers live (K %d, %d without prefetch)"
                      % (tag, peak, K, needed))
                first_use = lambda g: next(i for i in range(at[g + ".wait"] + 1, len(items))
                                           if items[i][0] not in ("Wait", "AllGather", "ReduceScatter", "AllReduce"))
                for prev, cur in zip(bg, bg[1:]):
                    if K == 1:  # never two live: the start follows the previous buffer's Free
                        check(at[cur] > at[prev.replace(".gather.", ".free.")], "%s: %s before %s is freed"
                              % (tag, cur, prev))
                    elif mode == "backward_pre":  # before the previous unit's gradients are computed
                        check(at[cur] < first_use(prev), "%s: %s not prefetched before %s's compute" % (tag, cur, prev))
                    elif mode == "backward_post":  # right after the previous unit's reduce-scatter starts (if
                        rs = prev.replace(".gather.bwd", ".reduce_scatter")  # that comes first: a tied unit's)
                        check(at[cur] == at[rs] + 1 or (at[rs] > at[cur] and at[cur] + 1 == at[cur + ".wait"]),
                              "%s: %s at %d, %s at %d" % (tag, cur, at[cur], rs, at[rs]))
                    if mode == "none":  # started where needed: nothing runs between start and wait
                        check(all(items[i][0] in ("Wait", "AllGather", "ReduceScatter", "AllReduce", "Free")
                                  for i in range(at[cur], at[cur + ".wait"])), "%s: %s prefetched" % (tag, cur))
                for prev, cur in zip(fg, fg[1:]):
                    if fwd and K == 2 and needed == 1:
                        check(at[cur] < first_use(prev), "%s: %s not prefetched before %s's compute" % (tag, cur, prev))
                    if not fwd:
                        check(at[cur] + 1 == at[cur + ".wait"], "%s: %s prefetched without --forward-prefetch"
                              % (tag, cur))
                # a reduce-scatter is waited for before the next one starts
                rss = [n for op, n in items if op == "ReduceScatter"]
                for a, b in zip(rss, rss[1:]):
                    check(at[a + ".wait"] < at[b], "%s: two reduce-scatters in flight (%s, %s)" % (tag, a, b))
    print("%s: prefetch modes, --forward-prefetch and --max-inflight 1, 2 placed as documented" % what)


def main():
    fsdpc, model = sys.argv[1], sys.argv[2]
    base = [fsdpc, model, "--loss", "mse:y,target", "--dim", "batch=4", "--wrap", "size:1000", "--verify", "--target", "cpu"]
    for p in PASSES:
        out = run(base + ["--dump-after", p]).stdout
        check(out.startswith("# after " + p), "dump after %s: header missing" % p)
        check("nodes:" in out, "dump after %s: no node list" % p)
    # fuse: elementwise chains become Fused nodes (not with --no-fuse); the GPT's GELU is one Gelu node (the gelu
    # pass) and its gradient one UnaryGrad, under bf16 each fused with its Casts; --no-fuse keeps the GELU
    # composed (its Erf) and fuses nothing
    gpt = [fsdpc, os.path.join(os.path.dirname(model), "gpt.onnx"), "--loss", "cross_entropy:logits,labels",
           "--dim", "batch=2", "--verify", "--target", "cpu", "--dump-after", "fuse"]
    fused = re.findall(r'= Fused .* ops="([A-Za-z,]+)"', run(gpt + ["--precision", "bf16"]).stdout)
    check(fused.count("Cast,Gelu,Cast") == 2 and fused.count("Cast,UnaryGrad,Cast") == 2,
          "fuse: the bf16 GPT's GELU forward and backward groups, got %s" % fused)
    out = run(gpt).stdout
    check(out.count("= Gelu ") == 2 and out.count("= UnaryGrad ") == 2 and "= Erf " not in out,
          "fuse: the GPT's GELU is not one Gelu node forward and one UnaryGrad backward per layer")
    out = run(gpt + ["--no-fuse"]).stdout
    check("Fused" not in out and out.count("= Erf ") == 2, "fuse: --no-fuse still fused, or its GELU not composed")
    # fold: nn.Linear's exported Transpose(W) is read through the MatMul's transB (no transposed copy of a
    # gathered weight kept alive until the backward), each layer's keys k^T = Transpose(k, (0,2,3,1)) through
    # the scores MatMul's transB as Transpose(k, (0,2,1,3)) (rows copied whole), and the GPT's Dropouts
    # (ratio 0) are gone
    fold = run(gpt[:-1] + ["fold"]).stdout.split("nodes:")[1]
    check(len(re.findall(r"= MatMul .*transB=1", fold)) == 9 + 2 and not re.search(r"Transpose %\d+ perm=\[1,0\]", fold)
          and "perm=[0,2,3,1]" not in fold and "Dropout" not in fold,
          "fold: 9 MatMuls reading W and 2 reading the keys with transB=1, no 2-D Transpose, no key transpose "
          "moving the last axis, no Dropout expected")
    # fuse: GEMM epilogues. Each Linear's bias Add is in its GEMM, and so is the residual Add after
    # attn.c_proj and mlp.c_proj (at the GEMM's place, before the unit's Free); no GEMM scaled (the GELU's factor
    # 0.5, which was the alpha of mlp.c_proj's input gradient, is inside its Gelu node now: passes_fuse's gpt
    # case, dumped before the gelu pass, keeps that alpha); --no-fuse: none
    out = run(gpt).stdout
    epi = re.findall(r"= MatMulAdd %\d+, %\d+, (%\d+|_), (%\d+|_)(.*)# \"(.*)\"", out)
    linear = [(b, a) for b, a, attrs, name in epi if "transB=1" in attrs]
    check(len(epi) == 8 and len(linear) == 8 and all(b != "_" for b, _ in linear) and
          sum(a != "_" for _, a in linear) == 4 and "alpha=" not in "".join(attrs for _, _, attrs, _ in epi),
          "fuse: 8 Linear MatMulAdds with a bias (4 with the residual), none scaled, expected; got %s" % epi)
    # attention: each block's scores, scale 1/sqrt(16), causal mask, Softmax and second product are one
    # FusedAttention and one FusedAttentionGrad; the mask (nanoGPT's buffer, Sliced, == 0, Cast) is recognised as
    # the causal band: no bias input, attribute causal, and none of the nodes that made it left (no Where,
    # Equal or Slice); the keys as rows (krow: fold reads k^T through the scores GEMM's transB); no Softmax or
    # score GEMM is left; q, k, v, y read and written in the projections' [B, T, H, dh] (heads 4): no head
    # Transpose left, forward or backward; --no-fuse keeps the chain
    body = out.split("nodes:")[1]
    att = re.findall(r"= FusedAttention %\d+, %\d+, %\d+ heads=4 scale=(\S+) nbias=1 brep=1 krow=1 causal=1 ", out)
    check(len(att) == 2 and all(s == "0.25" for s in att) and out.count("= FusedAttentionGrad ") == 2 and
          "Softmax " not in body and not re.search(r"= (Where|Equal|Slice|Transpose) ", body),
          "attention: 2 FusedAttention (heads 4, scale 0.25, causal, no bias, krow) and 2 FusedAttentionGrad, no "
          "mask nodes or head Transposes expected: %s"
          % re.findall(r".*= (?:FusedAttention|Where|Equal|Slice|Transpose) .*", body))
    nofuse = run(gpt + ["--no-fuse"]).stdout
    check("FusedAttention" not in nofuse and nofuse.count("= Softmax ") == 2, "attention: --no-fuse fused attention")
    check("MatMulAdd" not in run(gpt + ["--no-fuse"]).stdout, "fuse: --no-fuse made a MatMulAdd")
    # precision bf16: the gathered buffers and parameter views are bf16, every MatMul reads two bf16 operands
    # and writes f32, the shards and optimizer stay f32, bf16 values are only read by what may read them
    prec = gpt[:-1] + ["precision", "--precision", "bf16"]
    out = run(prec).stdout
    dtype = dict(re.findall(r"^\s+%(\d+) (\w+)\[", out, re.M))
    nodes = out.split("nodes:")[1]
    gathers = re.findall(r"%(\d+) = AllGather %(\d+)", nodes)
    check(gathers and all(dtype[y] == "bf16" and dtype[x] == "f32" for y, x in gathers),
          "precision: AllGather not f32 shard -> bf16 flat: %s" % gathers)
    mms = re.findall(r"%(\d+) = MatMul %(\d+), %(\d+)", nodes)
    check(len(mms) > 20 and all(dtype[a] == dtype[b] == "bf16" and dtype[y] == "f32" for y, a, b in mms),
          "precision: a MatMul without bf16 operands and an f32 result")
    check(re.search(r'AdamW %\d+, %\d+', nodes) and not re.search(r"bf16\[\d+\] (shard|gradshard|stateshard)", out),
          "precision: shards or optimizer state in bf16")
    check("MatMul" in run(gpt[:-1] + ["precision"]).stdout and " bf16[" not in run(gpt[:-1] + ["precision"]).stdout,
          "precision: fp32 (the default) changed the graph")
    # precision fp16: the same with f16 in place of bf16, and no bf16 anywhere
    out = run(gpt[:-1] + ["precision", "--precision", "fp16"]).stdout
    dtype = dict(re.findall(r"^\s+%(\d+) (\w+)\[", out, re.M))
    nodes = out.split("nodes:")[1]
    gathers = re.findall(r"%(\d+) = AllGather %(\d+)", nodes)
    mms = re.findall(r"%(\d+) = MatMul %(\d+), %(\d+)", nodes)
    check(gathers and all(dtype[y] == "f16" and dtype[x] == "f32" for y, x in gathers) and len(mms) > 20 and
          all(dtype[a] == dtype[b] == "f16" and dtype[y] == "f32" for y, a, b in mms) and " bf16[" not in out and
          not re.search(r"f16\[\d+\] (shard|gradshard|stateshard)", out),
          "precision fp16: AllGathers f32 -> f16, MatMuls f16 x f16 -> f32, shards f32 expected")
    # --shard: grad_op gathers once per unit (no reshard after forward), none never (parameters are views of
    # their shards), hybrid like full (unit1 = fc2, read by forward and backward)
    for strategy, gathers, frees in (("grad_op", 1, 1), ("none", 0, 0), ("hybrid:2", 2, 2), ("full", 2, 2)):
        nodes = run(base + ["--dump-after", "shard", "--shard", strategy]).stdout.split("nodes:")[1]
        g, f = len(re.findall(r'AllGather .*"unit1\.gather', nodes)), len(re.findall(r'Free .*"unit1\.free', nodes))
        check((g, f) == (gathers, frees), "--shard %s: unit1 has %d gathers and %d frees, expected %d and %d"
              % (strategy, g, f, gathers, frees))
        check("ReduceScatter" in nodes and "GradNormSq" in nodes, "--shard %s: no ReduceScatter / GradNormSq" % strategy)
    check_schedule([a if a != "size:1000" else "size:60" for a in base], "mlp (3 units, no root)")
    check_schedule(gpt[:-2] + ["--wrap", "blocks"], "gpt --wrap blocks")
    fold = run(base + ["--dump-after", "fold"]).stdout
    check(not re.search(r"= Gemm ", fold) and re.search(r"= MatMul ", fold), "fold: Gemm not decomposed")
    shard = run(base + ["--dump-after", "shard"]).stdout
    nodes = shard.split("nodes:")[1]
    for u in ("unit0", "unit1", "root"):
        for what in ("AllGather", "Free", "ReduceScatter", "AdamW"):
            check(re.search(r"%s .*# \"%s\." % (what, u), nodes), "shard: no %s for %s" % (what, u))
    # the forward gather of a unit precedes its first use; the reduce-scatter follows its last grad
    lines = nodes.strip().splitlines()
    first = lambda pat: next(i for i, l in enumerate(lines) if re.search(pat, l))
    check(first(r'"unit0.gather"') < first(r'"/fc1/Gemm/MatMul"') < first(r'"unit0.free"'), "unit0 gather/free order")
    check(first(r'"/fc1/Gemm/MatMul.dB"') < first(r'"unit0.reduce_scatter"') < first(r'"unit0.adamw"'),
          "unit0 reduce-scatter order")

    # --report compares the strategies: planned peak, this rank's shards, bytes sent per step (ring cost)
    rep = run(base + ["--report", "--world", "4"]).stdout
    rows = {m[0]: [int(x) for x in m[1:]] for m in re.findall(r"^  (full|grad_op|none|hybrid:2)\s+(\d+)\s+(\d+)\s+(\d+)$",
                                                            rep, re.M)}
    check(set(rows) == {"full", "grad_op", "none", "hybrid:2"}, "report: strategy rows %s:\n%s" % (sorted(rows), rep))
    n = 1088 + 4160 + 65  # the MLP's parameters, 4 bytes each; NO_SHARD all-reduces them: 2 (W-1)/W of the bytes
    check(rows["none"][2] == 2 * 3 * n * 4 // 4, "report: none sends %d B, expected %d" % (rows["none"][2], 6 * n))
    # (grad_op keeps the gathers it needs again in the backward, no re-gather: on this 3-unit MLP its third
    # slot holds only the root's flat gradient, full's a re-gathered unit1: so it plans less than full here
    # since each slot is its largest unit's size); the build's own plan (full) is the table's full row
    own = int(re.search(r"^  planned peak\s+(\d+) B", rep, re.M).group(1))
    check(rows["grad_op"][2] < rows["full"][2] and rows["full"][0] == own,
          "report: grad_op should send less than full, and full's row plan the build's %d B: %s" % (own, rows))
    check(abs(rows["none"][1] - 4 * rows["full"][1]) <= 4 * 3 * 4 * 64 and rows["hybrid:2"][1] > rows["full"][1],
          "report: shards per rank should be all (none), 1/4 (full), 1/2 (hybrid:2): %s" % rows)
    print("report at world 4: %s" % rows)

    with tempfile.TemporaryDirectory() as d:
        for world, prec in ((1, "fp32"), (3, "fp32"), (3, "bf16"), (3, "fp16")):
            rep = run(base + ["--report", "--world", str(world), "--precision", prec]).stdout
            check(re.search(r"unit0\s+2 params\s+1088 elements", rep), "report: unit0 counts:\n" + rep)
            check(re.search(r"root\s+2 params\s+65 elements", rep), "report: root counts:\n" + rep)
            planned = int(re.search(r"planned peak\s+(\d+) B", rep).group(1))
            exe = os.path.join(d, "t")
            run(base + ["-o", exe, "--precision", prec])
            import numpy as np
            np.save(os.path.join(d, "x.npy"), np.zeros((16, 16), np.float32))
            np.save(os.path.join(d, "y.npy"), np.zeros((16, 1), np.float32))
            m = os.path.join(d, "m.jsonl")
            run(mpirun(world, [exe, "--data", "x=" + os.path.join(d, "x.npy"), "--data",
                               "target=" + os.path.join(d, "y.npy"), "--steps", "1", "--metrics", m]))
            mem = json.loads(open(m).readline())["memory"]
            check(mem["total_bytes"] == planned, "world %d %s: runtime carved %d B, plan says %d B"
                  % (world, prec, mem["total_bytes"], planned))
            print("world %d %s: planned = carved = %d B" % (world, prec, planned))
            slots = int(re.search(r"gathered slots \(\d+, unit-sized\)\s+(\d+) B", rep).group(1))
            # a shard group of one rank: fp32 gathers and flat gradients are the shards, no slot allocated; with
            # --accum 2 the flat gradients need theirs again (the shard sums the micro-steps)
            check((slots == 0) == (world == 1 and prec == "fp32"), "world %d %s: slots %d B" % (world, prec, slots))
            if world == 1 and prec == "fp32":
                run(mpirun(1, [exe, "--data", "x=" + os.path.join(d, "x.npy"), "--data",
                               "target=" + os.path.join(d, "y.npy"), "--steps", "1", "--accum", "2", "--metrics", m]))
                acc = json.loads(open(m).readline())["memory"]
                check(acc["slot_bytes"] > 0 and acc["total_bytes"] == planned + acc["slot_bytes"],
                      "world 1 --accum 2: slots %d B, total %d B (plan at --accum 1: %d B)"
                      % (acc["slot_bytes"], acc["total_bytes"], planned))
                print("world 1 fp32: no slot (gathers and gradients are the shards); --accum 2: %d B of slots"
                      % acc["slot_bytes"])
            # --trace: every node of the first 2 steps of every rank on thread 0, in order; every collective's
            # run on thread 1, one at a time, after its start node began and before its Wait ended
            tr = os.path.join(d, "t.json")
            run(mpirun(world, [exe, "--data", "x=" + os.path.join(d, "x.npy"), "--data", "target=" +
                               os.path.join(d, "y.npy"), "--steps", "3", "--trace", tr, "--quiet"]))
            ev = [e for e in json.load(open(tr))["traceEvents"] if e["ph"] == "X"]
            dump = run(base + ["--dump-after", "memplan", "--precision", prec]).stdout.split("nodes:")[1]
            nnode = len(dump.strip().splitlines())
            ncoll = len(re.findall(r"= (AllGather|ReduceScatter|AllReduce) .* tag=\d+", dump))
            check(ncoll == len(re.findall(r" Wait .* tag=\d+", dump)) > 0, "schedule: %d collectives, waits:\n%s"
                  % (ncoll, dump))
            for r in range(world):
                for tid, n in ((0, nnode), (1, ncoll)):
                    mine = sorted((e for e in ev if e["pid"] == r and e["tid"] == tid), key=lambda e: e["ts"])
                    check(len(mine) == 2 * n and {e["args"]["step"] for e in mine} == {1, 2},
                          "--trace rank %d thread %d: %d events of steps %s, expected 2 x %d" % (r, tid, len(mine),
                          sorted({e["args"]["step"] for e in mine}), n))
                    check(all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(mine, mine[1:])) and
                          all(e["dur"] >= 0 for e in mine), "--trace rank %d thread %d: events overlap" % (r, tid))
                step = {(e["args"]["step"], e["name"]): e for e in ev if e["pid"] == r and e["tid"] == 0}
                for e in ev:
                    if e["pid"] != r or e["tid"] != 1:
                        continue
                    s, name = e["args"]["step"], e["name"]
                    start, wait = step[(s, name)], step[(s, name.split(" (")[0] + ".wait (Wait)")]
                    check(start["ts"] - 1e-3 <= e["ts"] and e["ts"] + e["dur"] <= wait["ts"] + wait["dur"] + 1e-3,
                          "--trace rank %d step %d: %s ran at %.1f+%.1f us, outside its start %.1f .. wait end %.1f"
                          % (r, s, name, e["ts"], e["dur"], start["ts"], wait["ts"] + wait["dur"]))
                coll = {e["name"].split(" (")[1] for e in ev if e["pid"] == r and e["tid"] == 1}
                check(coll == {"AllGather)", "ReduceScatter)", "AllReduce)"}, "--trace rank %d: thread 1 ran %s"
                      % (r, coll))
            print("world %d %s: --trace holds 2 x %d step events and 2 x %d collectives per rank, each collective "
                  "between its start and its wait" % (world, prec, nnode, ncoll))
            if world == 1:
                continue
            # the communication thread: on (FSDPC_COMM_THREAD=1), the step goes on past a collective's start node
            # before the collective ends (whether the two then run at the same time is up to the OS's scheduler on
            # 2 cores: counted, not asserted); off (=0), each runs inside its start node; unset, the executable
            # says which and why
            saved = os.environ.pop("FSDPC_COMM_THREAD", None)
            for env in ("1", "0", None):
                if env:
                    os.environ["FSDPC_COMM_THREAD"] = env
                p = run(mpirun(world, [exe, "--data", "x=" + os.path.join(d, "x.npy"), "--data", "target=" +
                                       os.path.join(d, "y.npy"), "--steps", "3", "--trace", tr]))
                os.environ.pop("FSDPC_COMM_THREAD", None)
                mode = re.search(r"^collectives: (.*)$", p.stdout, re.M)
                check(mode is not None, "no 'collectives:' line in:\n" + p.stdout)
                mode = mode.group(1)
                ev = [x for x in json.load(open(tr))["traceEvents"] if x["ph"] == "X"]
                ran = lambda x: (x["ts"], x["ts"] + x["dur"])
                overlaps = later = 0
                for r in range(world):
                    step = {(x["args"]["step"], x["name"]): x for x in ev if x["pid"] == r and x["tid"] == 0}
                    busy = [ran(x) for x in ev if x["pid"] == r and x["tid"] == 0 and "(Wait)" not in x["name"]]
                    for x in ev:
                        if x["pid"] != r or x["tid"] != 1:
                            continue
                        a, b = ran(x)
                        s0, s1 = ran(step[(x["args"]["step"], x["name"])])
                        inside = s0 - 1e-3 <= a and b <= s1 + 1e-3
                        check(env != "0" or inside, "FSDPC_COMM_THREAD=0: %s ran outside its start node" % x["name"])
                        later += b > s1 + 1e-3
                        overlaps += any(min(b, y1) - max(a, y0) > 0 for y0, y1 in busy if (y0, y1) != (s0, s1))
                if env == "1":
                    check(mode.startswith("on a communication thread") and later > 0,
                          "FSDPC_COMM_THREAD=1: '%s', no collective ended after its start node" % mode)
                elif env == "0":
                    check(mode == "inside the step (FSDPC_COMM_THREAD=0)" and later == overlaps == 0,
                          "FSDPC_COMM_THREAD=0: '%s', %d collectives beside compute" % (mode, overlaps))
                else:  # by the cores mpirun left each rank (its binding decides): either, with its reason
                    check(mode.startswith("on a communication thread beside the step (") or
                          mode.startswith("inside the step: 1 core for this rank"), "default: '%s'" % mode)
                print("world %d %s, FSDPC_COMM_THREAD=%s: collectives %s; %d ended after their start node, %d ran "
                      "beside compute" % (world, prec, env, mode, later, overlaps))
            if saved is not None:
                os.environ["FSDPC_COMM_THREAD"] = saved
    print("OK ir_dump")


if __name__ == "__main__":
    main()
