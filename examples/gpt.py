"""A nanoGPT-style decoder-only transformer in PyTorch (1.13), and its ONNX export for fsdpc.

Shared by the tests (tests/py/torch_gpt.py), the demo and the benchmarks:

    import sys; sys.path.insert(0, "examples")
    from gpt import GPT, GPTConfig, export
    model = GPT(GPTConfig(vocab_size=64, n_layer=2, n_head=2, n_embd=32, block_size=16))
    export(model, "gpt.onnx", B=4, T=16)

or from the command line (writes the ONNX file with freshly initialised weights):

    /usr/bin/python3 examples/gpt.py OUT.onnx [--vocab 64 --layers 2 --heads 2 --embd 32 --block 16
                                               --batch 4 --untied --dropout 0 --seed 0]

then

    fsdpc OUT.onnx -o train --target cpu --loss cross_entropy:logits,labels --dim batch=4
    ./train --tokens train.bin --steps 100

The model follows Karpathy's nanoGPT (model.py): token embedding wte + position
embedding wpe (indexed by torch.arange(T)), n_layer pre-LayerNorm blocks of
causal self-attention (one c_attn Linear producing q, k, v; the causal mask a
registered buffer `tril(ones)[1, 1, block, block]` applied with
masked_fill(mask[:, :, :T, :T] == 0, -inf); softmax; dropout) and a GELU MLP
(exact erf form, 4x wide), a final LayerNorm and the lm_head, tied to wte
(lm_head.weight is wte.weight) or untied.  forward(idx [B, T] int64) returns
the logits [B, T, vocab]; the loss is left to fsdpc (--loss
cross_entropy:logits,labels) or to the caller.

Initialisation as nanoGPT: normal(0, 0.02) for Linear and Embedding weights,
zero biases, c_proj weights normal(0, 0.02 / sqrt(2 * n_layer)).
"""
import argparse
import inspect
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class GPTConfig:
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    block_size: int = 16
    dropout: float = 0.0
    bias: bool = True      # biases in Linear layers and LayerNorms
    tied: bool = True      # lm_head.weight is transformer.wte.weight


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        assert cfg.n_embd % cfg.n_head == 0
        self.n_head, self.n_embd = cfg.n_head, cfg.n_embd
        self.scale = 1.0 / math.sqrt(cfg.n_embd // cfg.n_head)  # a Python float: no traced size in it
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        T = cfg.block_size
        self.register_buffer("mask", torch.tril(torch.ones(T, T)).view(1, 1, T, T))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        hs = C // self.n_head
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # [B, nh, T, hs]
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.scale
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # [B, nh, T, hs]
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()  # exact (erf) form
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, elementwise_affine=True)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, elementwise_affine=True)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        if cfg.tied:
            self.lm_head.weight = self.transformer.wte.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(mod):
        if isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, mean=0.0, std=0.02)
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
        elif isinstance(mod, nn.Embedding):
            nn.init.normal_(mod.weight, mean=0.0, std=0.02)

    def forward(self, idx):
        B, T = idx.size()
        if not torch.jit.is_tracing():  # (a traced assert only warns)
            assert T <= self.config.block_size, "sequence longer than block_size"
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        return self.lm_head(x)

    def loss(self, idx, targets):
        """PyTorch's counterpart of fsdpc's --loss cross_entropy:logits,labels"""
        logits = self(idx)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def export(model, path, B, T):
    """ONNX (opset 17) of model in training mode: parameter names and layouts kept
    (no constant folding, so nothing is folded into or aliased with anything else);
    the batch axis symbolic ("batch"), the sequence length static T."""
    idx = torch.zeros(B, T, dtype=torch.long)
    # the TorchScript exporter on every torch (dynamo=True is torch 2.9's default; it takes none of these options)
    kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    torch.onnx.export(model, (idx,), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes={"input_ids": {0: "batch"}, "logits": {0: "batch"}}, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--embd", type=int, default=32)
    ap.add_argument("--block", type=int, default=16, help="block_size = the sequence length T exported")
    ap.add_argument("--batch", type=int, default=4, help="batch of the dummy input (the axis stays symbolic)")
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--untied", action="store_true", help="lm_head gets its own weight")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    cfg = GPTConfig(vocab_size=a.vocab, n_layer=a.layers, n_head=a.heads, n_embd=a.embd, block_size=a.block,
                    dropout=a.dropout, tied=not a.untied)
    model = GPT(cfg)
    export(model, a.out, a.batch, a.block)
    n = sum(p.numel() for p in model.parameters())
    print("wrote %s: %s, %d parameters" % (a.out, cfg, n))


if __name__ == "__main__":
    main()
