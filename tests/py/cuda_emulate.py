"""The cuda executable runs without a GPU: fsdpc --target cuda --emulate = --target cpu.

usage: cuda_emulate.py FSDPC WORKDIR

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
(relative).
"""
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

from gpt import GPT, GPTConfig, export  # noqa: E402
from torch_ref import compile_exe, rel_err, train_exe  # noqa: E402

VOCAB, LAYERS, HEADS, EMBD, T = 64, 2, 2, 32, 16
GLOBAL_B, STEPS, NSAMPLES = 4, 8, 40


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
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
    for world in (1, 2):
        out = {}
        for target, extra in (("cpu", []), ("cuda", ["--target", "cuda", "--emulate"])):
            exe = os.path.join(work, "gpt_%s_w%d" % (target, world))
            compile_exe(fsdpc, onnx_path, exe, GLOBAL_B // world, extra)
            out[target] = train_exe(exe, world, ["--tokens", tok_path], STEPS, work)
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
              % (world, STEPS, lg[-1], lc[-1], len(files), worst))
    print("OK cuda_emulate: the emulated cuda GPT = the cpu target at world 1 and 2")


if __name__ == "__main__":
    main()
