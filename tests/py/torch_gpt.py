"""A nanoGPT-style transformer (examples/gpt.py) trains in fsdpc as in PyTorch.

usage: torch_gpt.py FSDPC WORKDIR

Config: vocab 64, 2 layers, 2 heads, n_embd 32, T = block_size 16, dropout 0;
tied (lm_head.weight is wte.weight: one ONNX initializer, whose gradient sums
both uses) and untied variants.  The data is a random uint16 token stream fed
with --tokens (sample k = tokens [16k, 16k+16), labels shifted by one), global
batch 4: per-rank batch 4/W at W = 1 and 2.  fsdpc compiles the exported ONNX
with --loss cross_entropy:logits,labels --optimizer adamw --wrap size:2000 and
trains 20 AdamW steps (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01),
dumping step 1's gradients (--dump-grads).  Checks against PyTorch (AdamW with
the same hyper-parameters, ranks simulated as in torch_ref.py; nothing in a GPT
depends on how the batch is split): step-1 loss and every parameter's gradient
within 1e-5 (norm-wise relative), all 20 losses within 1e-4.
"""
import copy
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))

from gpt import GPT, GPTConfig, export  # noqa: E402
from torch_ref import compare, compile_exe, reference, train_exe  # noqa: E402

VOCAB, LAYERS, HEADS, EMBD, T = 64, 2, 2, 32, 16
GLOBAL_B, STEPS, NSAMPLES = 4, 20, 40


def token_data(work):
    """the token file fsdpc reads (--tokens) and rank_batches(step, world) -> the ranks' (inputs, labels),
    the same samples in the same order"""
    rng = np.random.default_rng(0)
    toks = rng.integers(0, VOCAB, NSAMPLES * T + 1).astype(np.uint16)
    tok_path = os.path.join(work, "tokens.bin")
    toks.astype("<u2").tofile(tok_path)
    samples = (len(toks) - 1) // T

    def rank_batches(s, world):
        b = GLOBAL_B // world
        ks = [(s * GLOBAL_B + j) % samples for j in range(GLOBAL_B)]
        x = np.stack([toks[k * T: k * T + T] for k in ks]).astype(np.int64)
        y = np.stack([toks[k * T + 1: k * T + T + 1] for k in ks]).astype(np.int64)
        return [(torch.from_numpy(x[r * b:(r + 1) * b]), torch.from_numpy(y[r * b:(r + 1) * b]))
                for r in range(world)]
    return tok_path, rank_batches


def main():
    fsdpc, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.set_num_threads(1)
    tok_path, rank_batches = token_data(work)

    def loss_fn(model, x, y):
        return model.loss(x, y)

    for tied in (True, False):
        torch.manual_seed(0)
        cfg = GPTConfig(vocab_size=VOCAB, n_layer=LAYERS, n_head=HEADS, n_embd=EMBD, block_size=T,
                        dropout=0.0, tied=tied)
        model = GPT(cfg)
        name = "gpt_tied" if tied else "gpt_untied"
        onnx_path = os.path.join(work, name + ".onnx")
        export(copy.deepcopy(model), onnx_path, GLOBAL_B, T)
        for world in (1, 2):
            ref_model = copy.deepcopy(model)
            ref_losses, ref_grads = reference(ref_model, loss_fn, rank_batches, world, STEPS)
            exe = os.path.join(work, "%s_w%d" % (name, world))
            compile_exe(fsdpc, onnx_path, exe, GLOBAL_B // world)
            losses, dump = train_exe(exe, world, ["--tokens", tok_path], STEPS, work)
            compare("%s world %d" % (name, world), ref_model, ref_losses, ref_grads, losses, dump)
    print("OK torch_gpt: tied and untied, world 1 and 2: step-1 loss and gradients, %d AdamW steps" % STEPS)


if __name__ == "__main__":
    main()
