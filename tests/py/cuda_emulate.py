"""The cuda executable runs without a GPU: fsdpc --target cuda --emulate = --target cpu.

usage: cuda_emulate.py FSDPC WORKDIR [--quick]

fsdpc --target cuda --emulate links the CUDA emulation (runtime/cuemu_*.c:
the CUDA runtime, cuBLASLt and NCCL on the host, kernels/cuda and the
model's fused kernels compiled for the host) in place of the GPU libraries:
the same emitted step and the same dev_cuda.c / kc_rt.c / comm_nccl.c
object code.  A nanoGPT-style transformer (examples/gpt.py: vocab 64, 2
layers, 2 heads, n_embd 32, T 16; FusedAttention, LayerNorm, GELU, fused
elementwise kernels, the tied embedding) is compiled for both targets and
trained 8 AdamW steps at world 1 and 2 (FULL_SHARD, separate processes under
mpirun: the emulated NCCL), step 2 on captured and replayed as a CUDA Graph,
with FSDPC_NO_TF32=1 (exact float32 GEMMs).  Every loss and every step-1
gradient of the emulated cuda run must equal the cpu target's within 1e-5
(relative).  Then 4 steps' losses, equal within 1e-5, for SHARD_GRAD_OP and
NO_SHARD at world 2, HYBRID_SHARD (hybrid:2: ncclCommSplit) at world 4,
--accum 2 in both modes, --no-cuda-graph (cuda only: eager steps) and
--recompute units with --prefetch none.
--quick (the sanitizer build's cuda_emulate_quick: its emulated executables
are built with ASan + UBSan): world 2 only, 3 steps (eager, captured,
replayed), no variants.
"""
import os
import sys

import numpy as np
import torch

from common import mpirun, run

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

from gpt import GPT, GPTConfig, export  # noqa: E402
from torch_ref import compile_exe, rel_err, train_exe  # noqa: E402

VOCAB, LAYERS, HEADS, EMBD, T = 64, 2, 2, 32, 16
GLOBAL_B, STEPS, NSAMPLES = 4, 8, 40


def losses_of(exe, world, flags):
    """the losses a 4-step run prints"""
    out = run(mpirun(world, [exe, "--steps", "4"] + flags), timeout=1800).stdout
    return [float(l.split()[3]) for l in out.splitlines() if l.startswith("step ")]


def variants(fsdpc, onnx_path, tok_path, work):
    """compile options x run options at a world size: the emulated cuda losses = the cpu target's"""
    cases = [(["--shard", "grad_op"], 2, []), (["--shard", "none"], 2, []), (["--shard", "hybrid:2"], 4, []),
             (["--shard", "grad_op"], 2, ["--accum", "2", "--accum-mode", "comm"]),
             (["--shard", "grad_op"], 2, ["--accum", "2", "--accum-mode", "local"]),
             (["--recompute", "units", "--prefetch", "none"], 2, [])]
    for i, (extra, world, flags) in enumerate(cases):
        got = {}
        for target, t in (("cpu", []), ("cuda", ["--target", "cuda", "--emulate"])):
            exe = os.path.join(work, "v%d_%s" % (i, target))
            compile_exe(fsdpc, onnx_path, exe, GLOBAL_B // world, extra + t)
            got[target] = losses_of(exe, world, ["--tokens", tok_path] + flags)
            if target == "cuda" and i == 0:  # eager steps too
                got["eager"] = losses_of(exe, world, ["--tokens", tok_path, "--no-cuda-graph"] + flags)
        for k in [k for k in got if k != "cpu"]:
            if len(got[k]) != 4 or any(abs(a - b) > 1e-5 * abs(b) for a, b in zip(got[k], got["cpu"])):
                raise SystemExit("FAILED: %s at world %d %s (%s): losses %s, cpu %s"
                                 % (" ".join(extra), world, " ".join(flags), k, got[k], got["cpu"]))
        print("%s at world %d %s: 4 losses equal" % (" ".join(extra), world, " ".join(flags)))


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    quick = sys.argv[3:] == ["--quick"]
    steps = 3 if quick else STEPS
    os.makedirs(work, exist_ok=True)
    os.environ["FSDPC_NO_TF32"] = "1"
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    tok_path = os.path.join(work, "tokens.bin")
    rng.integers(0, VOCAB, NSAMPLES * T + 1).astype("<u2").tofile(tok_path)
    model = GPT(GPTConfig(vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD, block_size=T,
                          dropout=0.0, tied=True))
    onnx_path = os.path.join(work, "gpt.onnx")
    export(model, onnx_path, GLOBAL_B, T)
    for world in (2,) if quick else (1, 2):
        out = {}
        for target, extra in (("cpu", []), ("cuda", ["--target", "cuda", "--emulate"])):
            exe = os.path.join(work, "gpt_%s_w%d" % (target, world))
            compile_exe(fsdpc, onnx_path, exe, GLOBAL_B // world, extra)
            out[target] = train_exe(exe, world, ["--tokens", tok_path], steps, work)
        (lc, dc), (lg, dg) = out["cpu"], out["cuda"]
        for s, (a, b) in enumerate(zip(lg, lc)):
            if abs(a - b) > 1e-5 * abs(b):
                raise SystemExit("FAILED: world %d step %d: emulated cuda loss %.9g, cpu %.9g" % (world, s + 1, a, b))
        files = sorted(os.listdir(dc))
        if not files or sorted(os.listdir(dg)) != files:
            raise SystemExit("FAILED: world %d: gradient files differ: %s vs %s" % (world, files, os.listdir(dg)))
        worst = max(rel_err(np.load(os.path.join(dg, f)), np.load(os.path.join(dc, f))) for f in files)
        if worst > 1e-5:
            raise SystemExit("FAILED: world %d: a step-1 gradient differs by %.3g (relative)" % (world, worst))
        print("world %d: %d losses equal (last %.7g vs %.7g), %d gradients within %.2g"
              % (world, steps, lg[-1], lc[-1], len(files), worst))
    if quick:
        print("OK cuda_emulate --quick: the emulated cuda GPT = the cpu target at world 2, 3 steps")
        return
    variants(fsdpc, onnx_path, tok_path, work)
    print("OK cuda_emulate: the emulated cuda GPT = the cpu target at world 1 and 2, and in 7 variants")


if __name__ == "__main__":
    main()
