"""--shard full|grad_op|none|hybrid:F: every strategy trains exactly as FULL_SHARD at world 1.

usage: strategies.py FSDPC WORKDIR

Models: the shipped MLP (examples/mlp.onnx, mse) fed with --data, and a GPT
(examples/gpt.py: 2 layers, tied head, dropout 0) fed with --tokens; global
batch 12, so per-rank batch 12/W.  For every strategy and world size in
{1, 2, 3, 4} (hybrid:2 at 2 and 4), and each prefetch schedule (the
default backward_pre; backward_post with --forward-prefetch; none with
--max-inflight 1), the executable trains 6 steps (the MLP
with AdamW, the GPT with SGD and momentum) with --clip-grad-norm small
enough to clip every step: every loss, the reported
gradient norm (the norm over shards, each counted once however many groups
replicate it) and every exported weight equal world-1 FULL_SHARD's within
1e-5.  Memory: the per-rank model state is 1/W of the whole for full and
grad_op, 2/W for hybrid:2, the whole for none; the slots the executable
carves are the bytes --report plans for that strategy and world (each slot
its largest unit's size), none gathers nothing.  Errors:
hybrid:2 on 3 ranks and --report --world 3 with hybrid:2 are one-line errors.
With --precision bf16 (the GPT), grad_op, none and hybrid:2 at world 2-4
follow bf16 FULL_SHARD at world 1 within 1e-4.  The wrap policies --wrap
blocks and --wrap prefix:A,B make the GPT's two transformer blocks units
(--report: unit0 unit1 root) and train as world-1 FULL_SHARD within 1e-5.
--accum 3 with a third of the batch (world 2 full, world 4 hybrid:2) equals
the whole batch within 1e-5 (losses, clipped gradient norms, weights), with
--accum-mode comm and local (and local at world 2 none), local holding F
times the gradient shards in its unsharded accumulation buffers.
--reduce-dtype bf16 (world 1, 2 full, 4 hybrid:2, 2 none) follows the fp32
reduction within 1e-4 and differs from it (the gradients really are
rounded to bfloat16).
"""
import copy
import itertools
import json
import os
import re
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from common import check, mpirun, onnx_weights, rel_err, run  # noqa: E402

GLOBAL_B, STEPS, CLIP = 12, 6, 0.05
STRATEGIES = ["full", "grad_op", "none", "hybrid:2"]
# the schedule's prefetch modes (compile flags): the default (backward_pre), and two more
PREFETCH = {"pre": [], "post+fwd": ["--prefetch", "backward_post", "--forward-prefetch"],
            "none,K1": ["--prefetch", "none", "--max-inflight", "1"]}


def metrics(path):
    rows = [json.loads(l) for l in open(path)]
    return rows[0]["memory"], [r for r in rows if "step" in r]


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(0)

    # the models and their data
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    import torch
    from gpt import GPT, GPTConfig, export
    torch.manual_seed(0)
    gpt = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.0, tied=True))
    export(copy.deepcopy(gpt), J("gpt.onnx"), 4, 16)
    rng.integers(0, 64, 16 * 48 + 1).astype("<u2").tofile(J("tokens.bin"))
    models = {
        "mlp": (os.path.join(ROOT, "examples", "mlp.onnx"),
                ["--loss", "mse:y,target", "--wrap", "size:600", "--optimizer", "adamw"],
                ["--data", "x=" + J("x.npy"), "--data", "target=" + J("t.npy"), "--lr", "1e-3"]),
        "gpt": (J("gpt.onnx"), ["--loss", "cross_entropy:logits,labels", "--wrap", "size:9000", "--optimizer", "sgd"],
                ["--tokens", J("tokens.bin"), "--lr", "0.1", "--momentum", "0.9"]),
    }
    train = ["--steps", str(STEPS), "--clip-grad-norm", str(CLIP), "--quiet"]

    for name, (model, flags, data) in models.items():
        ref = None
        for strategy in STRATEGIES:
            for world, (pf, pflags) in itertools.product((1, 2, 3, 4), PREFETCH.items()):
                tag = "%s_%s_w%d" % (name, strategy.replace(":", ""), world) + ("" if pf == "pre" else "_" + pf)
                if strategy == "hybrid:2" and world % 2 and pf != "pre":
                    continue  # (the refusal below is the prefetch modes' same start-up check: built once)
                exe = J(tag)
                run([fsdpc, model, "-o", exe, "--target", "cpu", "--dim", "batch=%d" % (GLOBAL_B // world),
                     "--shard", strategy, "--verify"] + flags + pflags)
                argv = [exe] + data + train + ["--metrics", exe + ".jsonl", "--export-onnx", exe + ".onnx"]
                if strategy == "hybrid:2" and world % 2:
                    p = run(mpirun(world, argv), check=False)
                    check(p.returncode != 0 and "not a multiple of 2" in p.stderr,
                          "%s: hybrid:2 on %d ranks should fail with a message, got %d:\n%s"
                          % (tag, world, p.returncode, p.stderr[-1500:]))
                    continue
                run(mpirun(world, argv))
                mem, rows = metrics(exe + ".jsonl")
                w = onnx_weights(exe + ".onnx")
                check(len(rows) == STEPS, "%s: %d steps" % (tag, len(rows)))
                if ref is None:
                    ref = (mem, rows, w)
                    check(all(r["grad_norm"] > CLIP for r in rows), "%s: the clip should act on every step: %s"
                          % (tag, [r["grad_norm"] for r in rows]))
                    continue
                for s, (r, q) in enumerate(zip(rows, ref[1])):
                    for key in ("loss", "grad_norm"):
                        check(abs(r[key] - q[key]) <= 1e-5 * abs(q[key]), "%s step %d: %s %.9g, world-1 full %.9g"
                              % (tag, s + 1, key, r[key], q[key]))
                for k, v in ref[2].items():
                    e = rel_err(w[k], v)
                    check(e <= 1e-5, "%s: weight %s differs from world-1 full by %.3g" % (tag, k, e))
                # model state per rank: a shard of ceil(n/F) per unit (64-byte rounding: a little slack)
                whole = ref[0]["model_state_bytes"]
                F = {"none": 1, "hybrid:2": 2}.get(strategy, world)
                share = mem["state_bytes"] * F / whole
                check(0.99 <= share <= 1.0 + 0.02 * F, "%s: state %d B per rank, expected ~%d/%d of %d B"
                      % (tag, mem["state_bytes"], 1, F, whole))
                ref_mem = metrics(J("%s_full_w%d%s.jsonl" % (name, world, "" if pf == "pre" else "_" + pf)))[0]
                rep = run([fsdpc, model, "--target", "cpu", "--dim", "batch=%d" % (GLOBAL_B // world), "--shard",
                           strategy, "--report", "--world", str(world)] + flags + pflags).stdout
                planned = int(re.search(r"gathered slots \(\d+, unit-sized\)\s+(\d+) B", rep).group(1))
                check(mem["slot_bytes"] == planned, "%s: the executable carved %d B of slots, --report plans %d B"
                      % (tag, mem["slot_bytes"], planned))
                if strategy == "none" and world > 1:
                    check(mem["slot_bytes"] < ref_mem["slot_bytes"], "%s: none gathers nothing, yet its slots "
                          "(%d B) are not below full's (%d B)" % (tag, mem["slot_bytes"], ref_mem["slot_bytes"]))
                print("%-22s losses and grad norms = world-1 full; state %6d B/rank (%s of %d B), slots %d B"
                      % (tag, mem["state_bytes"], "1/%d" % F if F > 1 else "all", whole, mem["slot_bytes"]))
    # --accum 3 of a third of the batch (world 2: 2 per rank, or hybrid:2 at world 4: 1 per rank) = the batch
    built = set()
    for name, (model, flags, data) in models.items():
        ref = metrics(J("%s_full_w1.jsonl" % name))[1], onnx_weights(J("%s_full_w1.onnx" % name))
        for strategy, world, mode in (("full", 2, "comm"), ("hybrid:2", 4, "comm"), ("full", 2, "local"),
                                      ("hybrid:2", 4, "local"), ("none", 2, "local")):
            exe = J("%s_accum_%s_w%d" % (name, strategy.replace(":", ""), world))
            if exe not in built:
                built.add(exe)
                run([fsdpc, model, "-o", exe, "--target", "cpu", "--dim", "batch=%d" % (GLOBAL_B // world // 3),
                     "--shard", strategy, "--verify"] + flags)
            run(mpirun(world, [exe] + data + train + ["--accum", "3", "--accum-mode", mode, "--metrics", exe + ".jsonl",
                                                     "--export-onnx", exe + ".onnx"]))
            (mem, rows), w = metrics(exe + ".jsonl"), onnx_weights(exe + ".onnx")
            e = max(max(abs(r[k] - q[k]) / q[k] for k in ("loss", "grad_norm")) for r, q in zip(rows, ref[0]))
            ew = max(rel_err(w[k], v) for k, v in ref[1].items())
            check(len(rows) == STEPS and e <= 1e-5 and ew <= 1e-5, "%s --accum 3 --accum-mode %s (%s, world %d): "
                  "losses/norms %.3g, weights %.3g from world-1 full" % (name, mode, strategy, world, e, ew))
            # local keeps an unsharded gradient per unit: F times the gradient shards (64-byte rounding aside)
            F = {"none": 1, "hybrid:2": 2}.get(strategy, world)
            acc = mem["accum_bytes"]
            check(acc == 0 if mode == "comm" else F * mem["grad_bytes"] <= acc <= F * mem["grad_bytes"] + 64 * 8,
                  "%s --accum-mode %s (%s, world %d): accumulation buffers %d B, gradient shards %d B"
                  % (name, mode, strategy, world, acc, mem["grad_bytes"]))
            print("%s --accum 3 --accum-mode %-5s batch %d/rank, %-8s world %d: losses, norms within %.2g, weights "
                  "%.2g of world-1 full; accumulation buffers %d B" % (name, mode, GLOBAL_B // world // 3, strategy,
                                                                       world, e, ew, acc))

    # the wrap policies: other units, the same training (the GPT: 2 blocks + the root)
    model, flags, data = models["gpt"]
    ref = metrics(J("gpt_full_w1.jsonl"))[1], onnx_weights(J("gpt_full_w1.onnx"))
    for wrap, world in (("blocks", 2), ("prefix:transformer.h.1,transformer.h.0", 3), ("blocks", 4)):
        exe = J("gpt_wrap_%s_w%d" % (wrap.split(":")[0], world))
        run([fsdpc, model, "-o", exe, "--target", "cpu", "--dim", "batch=%d" % (GLOBAL_B // world), "--verify"]
            + flags + ["--wrap", wrap, "--shard", "hybrid:2" if world == 4 else "full"])
        rep = run([fsdpc, model, "--report", "--world", str(world), "--dim", "batch=4"] + flags + ["--wrap", wrap]).stdout
        units = re.findall(r"^  (unit\d+|root) ", rep, re.M)
        check(units == ["unit0", "unit1", "root"], "--wrap %s: units %s, expected unit0 unit1 root" % (wrap, units))
        run(mpirun(world, [exe] + data + train + ["--metrics", exe + ".jsonl", "--export-onnx", exe + ".onnx"]))
        rows, w = metrics(exe + ".jsonl")[1], onnx_weights(exe + ".onnx")
        e = max(abs(r["loss"] - q["loss"]) / q["loss"] for r, q in zip(rows, ref[0]))
        ew = max(rel_err(w[k], v) for k, v in ref[1].items())
        check(len(rows) == STEPS and e <= 1e-5 and ew <= 1e-5, "--wrap %s at world %d: losses %.3g, weights %.3g "
              "from world-1 full" % (wrap, world, e, ew))
        print("--wrap %-40s world %d: 3 units; losses within %.2g, weights %.2g of world-1 full" % (wrap, world, e, ew))

    # --precision bf16 under every strategy: the same rounding of the same values, float32 reductions
    model, flags, data = models["gpt"]
    ref = None
    for strategy, world in (("full", 1), ("grad_op", 2), ("none", 2), ("hybrid:2", 4)):
        exe = J("gpt16_%s_w%d" % (strategy.replace(":", ""), world))
        run([fsdpc, model, "-o", exe, "--target", "cpu", "--dim", "batch=%d" % (GLOBAL_B // world), "--shard",
             strategy, "--precision", "bf16", "--verify"] + flags)
        run(mpirun(world, [exe] + data + train + ["--metrics", exe + ".jsonl"]))
        rows = metrics(exe + ".jsonl")[1]
        if ref is None:
            ref = rows
            continue
        e = max(abs(r["loss"] - q["loss"]) / q["loss"] for r, q in zip(rows, ref))
        check(len(rows) == STEPS and e <= 1e-4, "bf16 %s at world %d: losses differ from world-1 full by %.3g"
              % (strategy, world, e))
        print("bf16 %-9s world %d: losses within %.2g of world-1 full" % (strategy, world, e))
    # --reduce-dtype bf16: gradients rounded to bf16 and averaged in bf16, shards and optimizer in fp32
    model, flags, data = models["gpt"]
    plain = ["--steps", str(STEPS), "--quiet"]
    ref = None
    for strategy, world, rd in (("full", 1, "fp32"), ("full", 1, "bf16"), ("full", 2, "bf16"), ("hybrid:2", 4, "bf16"),
                                ("none", 2, "bf16")):
        exe = J("gptrd_%s_%s_w%d" % (rd, strategy.replace(":", ""), world))
        run([fsdpc, model, "-o", exe, "--target", "cpu", "--dim", "batch=%d" % (GLOBAL_B // world), "--shard",
             strategy, "--reduce-dtype", rd, "--verify"] + flags)
        run(mpirun(world, [exe] + data + plain + ["--metrics", exe + ".jsonl"]))
        rows = metrics(exe + ".jsonl")[1]
        if ref is None:
            ref = rows
            continue
        d = [abs(r["loss"] - q["loss"]) / q["loss"] for r, q in zip(rows, ref)]
        check(len(rows) == STEPS and max(d) <= 1e-4 and max(d) > 0, "--reduce-dtype bf16, %s at world %d: losses "
              "differ from fp32 world 1 by up to %.3g (expected (0, 1e-4]: rounded, yet close)" % (strategy, world, max(d)))
        print("--reduce-dtype bf16 %-9s world %d: losses within %.2g of the fp32 reduction" % (strategy, world, max(d)))

    p = run([fsdpc, models["mlp"][0], "--report", "--world", "3", "--shard", "hybrid:2", "--dim", "batch=4"]
            + models["mlp"][1], check=False)
    check(p.returncode != 0 and "multiple of 2" in p.stderr, "--report --world 3 --shard hybrid:2: %s" % p.stderr)
    print("OK strategies: full, grad_op, none, hybrid:2 at world 1-4 equal world-1 FULL_SHARD (mlp, gpt)")


if __name__ == "__main__":
    main()
