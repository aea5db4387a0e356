"""PyTorch's training speed for the GPT that fsdpc benchmarks (gpt_bench), on the same GPU.

usage: python3 tests/gpu/torch_gpt_bench.py OUTDIR/manifest.json [--model gpt_bench] [--steps 10]
                                             [--warmup 3] [--modes eager,compile]

The model is examples/gpt.py's GPT (nanoGPT: explicit causal attention with a
mask, exact GELU, tied lm_head), built with the configuration prep.py
exported to ONNX for fsdpc; its parameter and buffer shapes are checked
against the ONNX initializers recorded in the manifest.  Like fsdpc's default
cuda build: float32 with TF32 matrix products, AdamW (fused), the cross-entropy
loss read back every step; modes "eager bf16" / "compile bf16" add
torch.autocast(bfloat16), to set beside fsdpc --precision bf16.  One JSON line per mode on stdout:
  {"mode": "torch eager", "step_ms": ..., "steps": N, "items_per_step": B*T,
   "peak_allocated": bytes, "peak_reserved": bytes, "compile_s": s}
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))
from gpt import GPT, GPTConfig  # noqa: E402


def build(entry):
    c = entry["config"]
    cfg = GPTConfig(vocab_size=c["vocab"], n_layer=c["layers"], n_head=c["heads"], n_embd=c["embd"],
                    block_size=c["T"], dropout=0.0, tied=c["tied"])
    model = GPT(cfg)
    sd = model.state_dict()
    for name, shape in c.get("onnx_shapes", []):
        if name not in sd or list(sd[name].shape) != shape:
            raise SystemExit("torch_gpt_bench: ONNX initializer %s %s has no match in the module (%s)"
                             % (name, shape, list(sd[name].shape) if name in sd else "missing"))
    return model, cfg


def bench(mode, model, cfg, x, y, steps, warmup):
    V = cfg.vocab_size

    def train_loss(idx, tgt):
        logits = model(idx)
        return F.cross_entropy(logits.view(-1, V), tgt.reshape(-1))

    # "... bf16": torch.autocast(bfloat16) around the forward, the recipe closest to
    # fsdpc --precision bf16 (bf16 GEMMs, fp32 master weights and optimizer)
    base, _, amp = mode.partition(" ")
    if amp == "bf16":
        plain = train_loss

        def train_loss(idx, tgt):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return plain(idx, tgt)
    fn = torch.compile(train_loss) if base == "compile" else train_loss
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8,
                            fused=True)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    times, warm_s = [], 0.0
    for s in range(warmup + steps):
        ts = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = fn(x, y)
        loss.backward()
        opt.step()
        loss.item()  # fsdpc reads its loss every step too
        if s == warmup - 1:
            warm_s = time.perf_counter() - t0
        if s >= warmup:
            times.append(time.perf_counter() - ts)
    return dict(mode="torch " + mode, step_ms=1e3 * statistics.median(times), steps=steps,
                items_per_step=x.numel(), peak_allocated=torch.cuda.max_memory_allocated(),
                peak_reserved=torch.cuda.max_memory_reserved(), compile_s=warm_s if base == "compile" else 0.0,
                loss=float(loss.item()))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("manifest")
    ap.add_argument("--model", default="gpt_bench")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="eager,compile", help="eager, compile, 'eager bf16', 'compile bf16'")
    a = ap.parse_args()
    entry = next((m for m in json.load(open(a.manifest))["models"] if m["name"] == a.model), None)
    if entry is None:
        raise SystemExit("torch_gpt_bench: no model %s in %s" % (a.model, a.manifest))
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.manual_seed(0)
    for mode in a.modes.split(","):
        model, cfg = build(entry)
        model = model.cuda().train()
        B, T = entry["batch"], cfg.block_size
        data = torch.randint(0, cfg.vocab_size, (B, T + 1), device="cuda")
        x, y = data[:, :T].contiguous(), data[:, 1:].contiguous()
        r = bench(mode, model, cfg, x, y, a.steps, a.warmup)
        print(json.dumps(r), flush=True)
        del model
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
