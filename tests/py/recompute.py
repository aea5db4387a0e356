"""--recompute units and selective: the same training in less activation memory, with no extra gather.

usage: recompute.py FSDPC WORKDIR

Each case builds one model twice, --recompute none and --recompute units (every
build --verify: ir_verify after every pass, the new one included), trains both
6 AdamW steps under mpirun and compares:
  - every loss and every exported weight bit for bit: a recomputed node runs
    the same kernel on the same bytes as its original (the backward gather of
    an unchanged shard is the forward's gather; dropout's mask is a
    counter-based function of the node's stream, the step and the element), so
    nothing may differ, not even in the last bit;
  - the planned activation bytes (--report "arena: activations (peak)" and the
    executable's arena) strictly smaller with recompute, the gathered slots
    unchanged;
  - the number of AllGather nodes (--dump-after recompute and memplan) the
    same: recompute reuses the backward's gather, never adds a third.
Cases: a GPT (examples/gpt.py: 2 layers, d 32, T 16, tied head) with --wrap blocks
and --wrap size:9000 under --shard full, grad_op, none, hybrid:2 at world 1 and
2, --precision bf16 (full, grad_op), --freeze; the same GPT with dropout 0.1 in
training mode (its losses differ from the dropout-0 model's: the masks act, and
the recomputed masks are the forward's: Dropout nodes are cloned); a Llama-shaped
model (scripts/shaped_model.py: RMSNorm as Mul, ReduceMean, Add, Sqrt, Div, rotary, grouped-query
attention) under units and selective, whose blocks' ln_1 RMSNorm chains are recomputed with their blocks (the
checkpoint boundary is the block's input, not the chain's output saved beside it); a ResNet-18
(torchvision, BatchNorm in training mode: the running statistics, written by
Assign nodes that are never cloned, are exported equal); the shipped MLP,
where every activation the backward reads is a unit's input or the root's, so
nothing is recomputed (no clone, the plan unchanged); the demo GPT
(examples/gpt.onnx, --wrap size:30000, batch 8): the activation saving the
README states.  --recompute selective (GEMM, convolution and attention outputs kept,
nothing of those cloned) on the GPT in fp32 and bf16 and on the ResNet: the same
checks, its planned activations between units' and none's.  --recompute none leaves the graph as precision made it; a bad
value is a one-line error; with the CUDA toolkit, --target cuda builds with
--recompute units (fp32 and bf16; for sm_80 alone, the arch cuda_target builds the library for too: the point is the step, one text for every arch).
"""
import copy
import os
import re
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "examples"))

from common import check, drop, export_resnet, mpirun, onnx_weights, read_metrics, run  # noqa: E402

GLOBAL_B, STEPS = 12, 6


def report(fsdpc, model, flags):
    out = run([fsdpc, model, "--report", "--world", "2"] + flags).stdout
    act = int(re.search(r"arena: activations \(peak\)\s+(\d+) B", out).group(1))
    slots = int(re.search(r"gathered slots \(\d+, unit-sized\)\s+(\d+) B", out).group(1))
    return act, slots, out


def dump(fsdpc, model, flags, after):
    return run([fsdpc, model, "--dump-after", after] + flags).stdout


def count(ir, pattern):
    return len(re.findall(pattern, ir, re.M))


def train(fsdpc, model, flags, world, data, exe):
    run([fsdpc, model, "-o", exe, "--verify"] + flags)
    run(mpirun(world, [exe] + data + ["--steps", str(STEPS), "--quiet", "--metrics", exe + ".jsonl",
                                      "--export-onnx", exe + ".onnx"]))
    losses, mem = read_metrics(exe + ".jsonl")
    check(len(losses) == STEPS, "%s: %d steps" % (exe, len(losses)))
    weights = onnx_weights(exe + ".onnx")
    drop(exe, keep=(".jsonl",))  # (a later check reads a run's metrics again)
    return losses, mem, weights


_runs = {}  # (model, flags, world): a --recompute none run, shared by the units and selective cases


def case(fsdpc, work, tag, model, flags, world, data, expect_saving=True, mode="units"):
    """train --recompute none and mode (units or selective); returns (losses, activations none, activations with
    mode, clones, the IR after recompute)"""
    res = {}
    for m in ("none", mode):
        f = flags + ["--recompute", m]
        key = (model, tuple(f), world)
        if m == "none" and key in _runs:
            res[m] = _runs[key]
            continue
        res[m] = train(fsdpc, model, f, world, data, os.path.join(work, "%s_%s" % (tag, m)))
        res[m] += report(fsdpc, model, f)[:2]
        res[m] += (dump(fsdpc, model, f, "recompute"), dump(fsdpc, model, f, "memplan"))
        if m == "none":
            _runs[key] = res[m]
    (l0, m0, w0, a0, s0, r0, p0), (l1, m1, w1, a1, s1, r1, p1) = res["none"], res[mode]
    check(l0 == l1, "%s: losses with recompute %s differ from without %s" % (tag, l1, l0))
    check(w0.keys() == w1.keys(), "%s: exported tensors differ" % tag)
    for k in w0:  # (the difference in float64: a bool initializer, a causal mask, has no subtraction)
        same = w0[k].dtype == w1[k].dtype and np.array_equal(w0[k], w1[k])
        check(same, "%s: exported %s differs with recompute (max |d| %.3g)" % (tag, k, 0 if same else np.max(
            np.abs(w0[k].astype(np.float64) - w1[k].astype(np.float64)))))
    for after, x, y in (("recompute", r0, r1), ("memplan", p0, p1)):
        g0, g1 = count(x, r"= AllGather "), count(y, r"= AllGather ")
        check(g0 == g1, "%s: %d AllGather nodes after %s with recompute, %d without" % (tag, g1, after, g0))
    clones = count(r1, r'@recompute"$')
    check(count(r0, r'@recompute"$') == 0, "%s: --recompute none made clones" % tag)
    check(count(r1, r'^  (\S+ = )?(Assign|Free|AllGather|ReduceScatter|AllReduce) .*@recompute"$') == 0,
          "%s: an Assign or a collective was cloned" % tag)
    check(s0 == s1, "%s: gathered slots %d B with recompute, %d B without" % (tag, s1, s0))
    if mode == "selective":
        check(count(r1, r'^  (\S+ = )?(MatMul|MatMulAdd|Conv|FusedAttention) .*@recompute"$') == 0,
              "%s: --recompute selective cloned a GEMM, convolution or attention" % tag)
    if expect_saving:
        check(clones > 0, "%s: nothing recomputed" % tag)
        check(a1 < a0 and m1["arena_bytes"] < m0["arena_bytes"], "%s: planned activations %d B (arena %d B) with "
              "recompute, %d B (%d B) without: expected less" % (tag, a1, m1["arena_bytes"], a0, m0["arena_bytes"]))
    print("%-44s world %d: losses and weights bit-identical; AllGather %d = %d; %3d clones; activations %8d -> %8d B"
          % (tag + " " + mode, world, count(p0, r"= AllGather "), count(p1, r"= AllGather "), clones, a0, a1))
    return l0, a0, a1, clones, r1


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    J = lambda *p: os.path.join(work, *p)
    rng = np.random.default_rng(0)
    import torch
    from gpt import GPT, GPTConfig, export
    for name, p in (("gpt", 0.0), ("gpt_drop", 0.1)):
        torch.manual_seed(0)
        m = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=p, tied=True))
        export(copy.deepcopy(m), J(name + ".onnx"), 4, 16)
    rng.integers(0, 64, 16 * 48 + 1).astype("<u2").tofile(J("tokens.bin"))
    tokens = ["--tokens", J("tokens.bin")]
    gpt = ["--target", "cpu", "--loss", "cross_entropy:logits,labels"]

    # the GPT under every strategy, both wrap policies, bf16, --freeze
    for wrap, shard, world, extra in (("blocks", "full", 1, []), ("blocks", "full", 2, []),
                                      ("blocks", "grad_op", 1, []), ("blocks", "grad_op", 2, []),
                                      ("size:9000", "full", 2, []), ("blocks", "none", 2, []),
                                      ("blocks", "hybrid:2", 2, []),
                                      ("blocks", "full", 2, ["--precision", "bf16"]),
                                      ("blocks", "grad_op", 1, ["--precision", "bf16"]),
                                      ("blocks", "full", 2, ["--freeze", "transformer.h.0.ln_*"])):
        tag = "gpt_%s_%s%s_w%d" % (wrap.replace(":", ""), shard.replace(":", ""),
                                   {"--precision": "_bf16", "--freeze": "_freeze"}[extra[0]] if extra else "", world)
        case(fsdpc, work, tag, J("gpt.onnx"), gpt + ["--dim", "batch=%d" % (GLOBAL_B // world), "--wrap", wrap,
                                                    "--shard", shard] + extra, world, tokens)

    # --recompute selective: GEMM and attention outputs kept, the ops between them recomputed (fp32, bf16)
    for world, extra in ((2, []), (2, ["--precision", "bf16"])):
        f = gpt + ["--dim", "batch=%d" % (GLOBAL_B // world), "--wrap", "blocks", "--shard", "full"] + extra
        tag = "gpt_blocks_full%s_w%d" % ("_bf16" if extra else "", world)
        _, a0, a1, _, _ = case(fsdpc, work, tag, J("gpt.onnx"), f, world, tokens, mode="selective")
        au = report(fsdpc, J("gpt.onnx"), f + ["--recompute", "units"])[0]
        check(au < a1 < a0, "%s: planned activations none %d B, selective %d B, units %d B: expected units < selective "
              "< none" % (tag, a0, a1, au))

    # dropout in training mode: the recomputed masks are the forward's
    ref = None
    for world, extra in ((2, []), (1, ["--precision", "bf16"])):
        tag = "gpt_dropout_blocks_full%s_w%d" % ("_bf16" if extra else "", world)
        losses, _, _, _, ir = case(fsdpc, work, tag, J("gpt_drop.onnx"), gpt + ["--dim", "batch=%d" % (GLOBAL_B // world),
                                   "--wrap", "blocks"] + extra, world, tokens)
        check(count(ir, r'= Dropout .*@recompute"$') >= 2, "%s: no Dropout recomputed" % tag)
        ref = ref or losses
    nodrop = read_metrics(J("gpt_blocks_full_w2_none.jsonl"))[0]
    check(all(a != b for a, b in zip(ref, nodrop)), "dropout 0.1 trains as dropout 0: %s vs %s" % (ref, nodrop))

    # a Llama-shaped model (scripts/shaped_model.py: RMSNorm written as Mul, ReduceMean, Add, Sqrt, Div before its
    # weight's Mul; rotary, grouped-query attention): a block's checkpoint boundary is its input, so the RMSNorm
    # chain before the block's first parameter read is recomputed with the block, not saved beside its input.
    # (Its GELU MLP, not SwiGLU: a forward Sigmoid fused with its Muls and the unfused Sigmoid of its clone differ
    # in the last bits today, so SwiGLU under recompute is not bit-identical; left open.)
    run([sys.executable, os.path.join(ROOT, "scripts", "shaped_model.py"), J("llama.onnx"), "--layers", "2", "--embd",
         "32", "--heads", "4", "--kv-heads", "2", "--block", "16", "--vocab", "64", "--batch", "6", "--norm", "rms",
         "--pos", "rotary", "--no-bias", "--untied", "--data", "random"])
    for mode in ("units", "selective"):
        _, _, _, _, ir = case(fsdpc, work, "llama_blocks_full_w2", J("llama.onnx"), gpt + ["--wrap", "blocks"], 2,
                              tokens, mode=mode)
        blocks = [i for i in (0, 1) if re.search(r'"transformer\.h\.%d\.\S+@recompute"$' % i, ir, re.M)]
        check(0 in blocks, "llama %s: block 0 not recomputed" % mode)
        for i in blocks:  # (the last block may be left out: its backward follows its forward at once)
            check(re.search(r'"transformer\.h\.%d\.ln_1/Div_\d+@recompute"$' % i, ir, re.M),
                  "llama %s: block %d's RMSNorm (ln_1/Div) is not recomputed: saved beside the block's input"
                  % (mode, i))

    # ResNet-18: BatchNorm in training mode (running statistics exported)
    export_resnet(J("resnet.onnx"))
    np.save(J("rx.npy"), rng.standard_normal((8, 3, 32, 32)).astype(np.float32))
    np.save(J("ry.npy"), rng.integers(0, 10, 8).astype(np.int64))
    for mode in ("units", "selective"):
        _, _, _, _, ir = case(fsdpc, work, "resnet18_blocks_full_w2", J("resnet.onnx"), gpt + ["--dim", "batch=2",
                              "--wrap", "blocks"], 2, ["--data", "x=" + J("rx.npy"), "--data", "labels=" + J("ry.npy")],
                              mode=mode)
        check(count(ir, r'= BatchNormalization .*@recompute"$') > 0, "resnet18 %s: no BatchNormalization recomputed"
              % mode)

    # the MLP: every activation its backward reads is a unit's input (the checkpoint boundary) or the root's
    mlp = [os.path.join(ROOT, "examples", "mlp.onnx"), ["--target", "cpu", "--loss", "mse:y,target", "--wrap",
           "size:600"]]
    np.save(J("x.npy"), rng.standard_normal((48, 16)).astype(np.float32))
    np.save(J("t.npy"), rng.standard_normal((48, 1)).astype(np.float32))
    for world in (1, 2):
        _, a0, a1, clones, _ = case(fsdpc, work, "mlp_size600_full_w%d" % world, mlp[0], mlp[1] + ["--dim", "batch=%d" %
                                    (GLOBAL_B // world)], world, ["--data", "x=" + J("x.npy"), "--data",
                                    "target=" + J("t.npy")], expect_saving=False)
        check(clones == 0 and a0 == a1, "mlp: %d clones, activations %d -> %d B: expected nothing recomputed"
              % (clones, a0, a1))

    # the demo GPT: the saving the README states
    demo = [os.path.join(ROOT, "examples", "gpt.onnx")] + gpt + ["--dim", "batch=8", "--wrap", "size:30000"]
    a0, s0, _ = report(fsdpc, demo[0], demo[1:])
    a1, s1, out = report(fsdpc, demo[0], demo[1:] + ["--recompute", "units"])
    line = [l for l in out.splitlines() if l.startswith("recompute units:")]
    check(a1 < a0 and s1 == s0 and len(line) == 1 and "%d B" % a0 in line[0] and "%d B" % a1 in line[0],
          "demo GPT: activations %d -> %d B, slots %d -> %d B, report line %s" % (a0, a1, s0, s1, line))
    print("demo GPT (examples/gpt.onnx, batch 8, --wrap size:30000, world 2): %s" % line[0])

    # none leaves the graph as it was; a bad value is one line
    flags = demo[1:]
    x = dump(fsdpc, demo[0], flags, "precision").split("\n", 1)[1]
    y = dump(fsdpc, demo[0], flags + ["--recompute", "none"], "recompute").split("\n", 1)[1]
    check(x == y, "--recompute none changed the graph")
    p = run([fsdpc, demo[0], "--report"] + flags + ["--recompute", "all"], check=False)
    lines = [l for l in p.stderr.splitlines() if l.strip()]
    check(p.returncode == 1 and len(lines) == 1 and "--recompute all" in lines[0] and "none, units or selective" in lines[0],
          "--recompute all: exit %d, %s" % (p.returncode, p.stderr))

    # the cuda target builds with it (no GPU needed to build)
    if shutil.which("nvcc") or os.path.exists("/usr/local/cuda/bin/nvcc"):
        for extra in ([], ["--precision", "bf16"]):
            exe = J("gpt_cuda" + "".join(extra).replace("-", "_"))
            run([fsdpc, demo[0], "-o", exe, "--target", "cuda", "--loss", "cross_entropy:logits,labels", "--dim",
                 "batch=4", "--wrap", "size:30000", "--recompute", "units", "--verify", "--arch", "sm_80"] + extra,
                timeout=900)
            check(os.path.exists(exe), "no cuda executable %s" % exe)
        print("--target cuda with --recompute units builds (fp32, bf16)")
    else:
        print("--target cuda: skipped (no CUDA toolkit)")
    print("OK recompute")


if __name__ == "__main__":
    main()
