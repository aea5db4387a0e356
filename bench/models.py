"""The models the benchmark matrix (bench/matrix.py) trains, built the same way by the exporting driver and by each
PyTorch side (bench/torch_step.py), so every side starts from the same module and weights.

A model is named KIND:SHAPE:
  gpt:d/L/T/B        examples/gpt.py's nanoGPT (vocab 256, one head per 64 channels): causal, pre-LayerNorm
  bert:d/L/T/B       a BERT-style encoder (below): bidirectional attention, post-LayerNorm, GELU MLP, an MLM head
                     (dense, GELU, LayerNorm, the decoder tied to the token embedding), vocab 256; every position is
                     a label (no masking: the step's arithmetic is a masked LM's at 100 % masking)
  llama:d/L/T/B      Hugging Face's LlamaForCausalLM as it builds it by default (attn_implementation sdpa: torch's
                     scaled_dot_product_attention), vocab 256, one query head per 64 channels and half as many
                     key/value heads (grouped-query attention, as Llama 3), an MLP of 8d/3 rounded up to 64;
                     exported by dynamo (torch >= 2.6, transformers) at torch's default opset, as users export
                     it today (export: the TorchScript exporter cannot write its SDPA)
  resnet18:S/B       torchvision's resnet18(num_classes=10) on B images of S x S (training-mode BatchNorm)
  resnet50:S/B       torchvision's resnet50(num_classes=10)
The token models read int64 input_ids [B, T] and labels [B, T]; the ResNets images x [B, 3, S, S] (float32) and
labels [B].  The loss is cross_entropy(logits, labels) over the last axis (fsdpc's --loss
cross_entropy:logits,labels).
"""
import math

VOCAB = 256
KINDS = ("gpt", "bert", "llama", "resnet18", "resnet50")


def parse(name):
    """"kind:a/b/..." -> (kind, (a, b, ...)), checked"""
    kind, _, shape = name.partition(":")
    try:
        dims = tuple(int(v) for v in shape.split("/"))
    except ValueError:
        dims = ()
    want = 4 if kind in ("gpt", "bert", "llama") else 2
    if kind not in KINDS or len(dims) != want or min(dims) < 1:
        raise SystemExit("bench: model %r: one of gpt:d/L/T/B, bert:d/L/T/B, llama:d/L/T/B, resnet18:S/B, "
                         "resnet50:S/B" % name)
    return kind, dims


def batch(name):
    """the batch size B of a model name"""
    return parse(name)[1][-1]


def input_name(name):
    return "x" if parse(name)[0].startswith("resnet") else "input_ids"


def build(name):
    """the torch module of name, its weights drawn from seed 0"""
    import torch
    kind, dims = parse(name)
    torch.manual_seed(0)
    if kind.startswith("resnet"):
        import torchvision
        return getattr(torchvision.models, kind)(num_classes=10)
    if kind == "llama":
        return _llama(*dims[:3])
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
    from gpt import GPT, GPTConfig
    d, L, T, _ = dims
    cfg = GPTConfig(vocab_size=VOCAB, n_layer=L, n_head=max(1, d // 64), n_embd=d, block_size=T)
    return GPT(cfg) if kind == "gpt" else _bert(cfg)


def batch_data(name):
    """(input, labels) numpy arrays of one batch of name, from seed 0"""
    import numpy as np
    kind, dims = parse(name)
    rng = np.random.default_rng(0)
    if kind.startswith("resnet"):
        S, B = dims
        return rng.standard_normal((B, 3, S, S)).astype(np.float32), rng.integers(0, 10, B).astype(np.int64)
    _, _, T, B = dims
    return rng.integers(0, VOCAB, (B, T)).astype(np.int64), rng.integers(0, VOCAB, (B, T)).astype(np.int64)


def _bert(cfg):
    """the BERT-style encoder of cfg (examples/gpt.py's GPTConfig; its MLP module reused)"""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from gpt import MLP

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.n_head, self.scale = cfg.n_head, 1.0 / math.sqrt(cfg.n_embd // cfg.n_head)
            self.qkv = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
            self.out = nn.Linear(cfg.n_embd, cfg.n_embd)

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                       for t in self.qkv(x).split(C, dim=2))
            y = F.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1) @ v
            return self.out(y.transpose(1, 2).contiguous().view(B, T, C))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.ln_1 = SelfAttention(), nn.LayerNorm(cfg.n_embd)
            self.mlp, self.ln_2 = MLP(cfg), nn.LayerNorm(cfg.n_embd)

        def forward(self, x):
            x = self.ln_1(x + self.attn(x))
            return self.ln_2(x + self.mlp(x))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg.vocab_size, cfg.n_embd), nn.Embedding(cfg.block_size, cfg.n_embd)
            self.ln_e = nn.LayerNorm(cfg.n_embd)
            self.layers = nn.ModuleList([Layer() for _ in range(cfg.n_layer)])
            self.head, self.ln_h = nn.Linear(cfg.n_embd, cfg.n_embd), nn.LayerNorm(cfg.n_embd)
            self.decoder = nn.Linear(cfg.n_embd, cfg.vocab_size)
            self.decoder.weight = self.wte.weight
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)

        def forward(self, idx):
            pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
            x = self.ln_e(self.wte(idx) + self.wpe(pos))
            for layer in self.layers:
                x = layer(x)
            return self.decoder(self.ln_h(F.gelu(self.head(x))))

    return Bert()


def _llama(d, L, T):
    """Hugging Face's Llama of d channels, L layers, T positions, its forward returning the logits"""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    h = max(1, d // 64)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=d, intermediate_size=(8 * d // 3 + 63) // 64 * 64,
                      num_hidden_layers=L, num_attention_heads=h, num_key_value_heads=max(1, h // 2),
                      max_position_embeddings=T)

    class Llama(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm = LlamaForCausalLM(cfg)

        def forward(self, input_ids):
            return self.lm(input_ids=input_ids).logits

    return Llama()


def export(model, name, path):
    """ONNX (opset 17, training mode, no constant folding) of model, the batch axis symbolic ("batch"), with the
    TorchScript exporter on every torch (dynamo=True is torch 2.9's default and takes none of these options); the
    Llama by dynamo (optimize=False) at its default opset, the batch symbolic too"""
    import inspect
    import torch
    x, _ = batch_data(name)
    inp = input_name(name)
    if parse(name)[0] == "llama":  # dynamo, its batch symbolic ("batch"), every parameter its own initializer
        torch.onnx.export(model, (torch.from_numpy(x),), path, dynamo=True, optimize=False, input_names=[inp],
                          output_names=["logits"], dynamic_shapes={inp: {0: torch.export.Dim("batch")}})
        return
    kw = {"dynamo": False} if "dynamo" in inspect.signature(torch.onnx.export).parameters else {}
    torch.onnx.export(model, (torch.from_numpy(x),), path, opset_version=17, training=torch.onnx.TrainingMode.TRAINING,
                      do_constant_folding=False, input_names=[inp], output_names=["logits"],
                      dynamic_axes={inp: {0: "batch"}, "logits": {0: "batch"}}, **kw)
